//! Every input of the f32 normals' two functions (kernels/random.cu,
//! modeled in tests/support/normal_f32.rs) against f64: all 2^32 words
//! `x0` for `-2 ln u1` and its square root `r`, all 2^32 words `x1` for
//! `cos t` and `sin t`; then the bound these give the standard normal
//! (mean 0, std 1) against the exact value and against the CPU's value.
//! docs/gpu-model.md records the output of
//!
//! ```text
//! cargo run --release -p tapir-tensor --example normal_f32_bounds
//! ```
//!
//! (about 3.5 minutes of CPU time a function, spread over every core).

#[path = "../tests/support/normal_f32.rs"]
mod normal_f32;

use normal_f32::{cos_sin_turn, cos_sin_turn_f64, minus_two_log_u1, minus_two_log_u1_f64, ulps};

/// Largest error in ulps and relative error (in units of 2^-24) of each of
/// the functions' outputs.
#[derive(Default, Clone, Copy)]
struct Worst {
    ulps: [f64; 2],
    rel: [f64; 2],
    at: [u32; 2],
}

impl Worst {
    fn add(&mut self, k: usize, x: u32, got: f32, want: f64) {
        if want == 0.0 {
            assert_eq!(got, 0.0, "input {x:#x}: {got} where the value is 0");
            return;
        }
        let (u, r) = (ulps(got, want), ((f64::from(got) - want) / want).abs() * 2f64.powi(24));
        if u > self.ulps[k] {
            (self.ulps[k], self.at[k]) = (u, x);
        }
        self.rel[k] = self.rel[k].max(r);
    }
    fn merge(mut self, o: Worst) -> Worst {
        for k in 0..2 {
            if o.ulps[k] > self.ulps[k] {
                (self.ulps[k], self.at[k]) = (o.ulps[k], o.at[k]);
            }
            self.rel[k] = self.rel[k].max(o.rel[k]);
        }
        self
    }
}

/// `f` on every u32, split over the machine's cores.
fn every_word(f: impl Fn(u32, &mut Worst) + Sync) -> Worst {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let chunk = (1u64 << 32).div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut w = Worst::default();
                    for x in t * chunk..((t + 1) * chunk).min(1 << 32) {
                        f(x as u32, &mut w);
                    }
                    w
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).fold(Worst::default(), Worst::merge)
    })
}

fn main() {
    let log = every_word(|x0, w| {
        let (got, want) = (minus_two_log_u1(x0), minus_two_log_u1_f64(x0));
        w.add(0, x0, got, want);
        w.add(1, x0, got.sqrt(), want.sqrt());
    });
    println!("-2 ln u1: {:.4} ulps (x0 = {:#010x}), relative {:.4} x 2^-24", log.ulps[0], log.at[0], log.rel[0]);
    println!(
        "r = sqrt(-2 ln u1): {:.4} ulps (x0 = {:#010x}), relative {:.4} x 2^-24",
        log.ulps[1], log.at[1], log.rel[1]
    );
    let trig = every_word(|x1, w| {
        let (got, want) = (cos_sin_turn(x1), cos_sin_turn_f64(x1));
        w.add(0, x1, got.0, want.0);
        w.add(1, x1, got.1, want.1);
    });
    println!("cos t: {:.4} ulps (x1 = {:#010x}), relative {:.4} x 2^-24", trig.ulps[0], trig.at[0], trig.rel[0]);
    println!("sin t: {:.4} ulps (x1 = {:#010x}), relative {:.4} x 2^-24", trig.ulps[1], trig.at[1], trig.rel[1]);
    // z = RN(r c) against Z = R C: |r c / Z - 1| <= er + ec + er ec, and an
    // ulp of f32 is at least |Z| 2^-24, so |r c - Z| is within 2^24 (er + ec
    // + er ec) ulps of Z, z within half an ulp more (a whole one where r c
    // rounds up into the next binade; then z and the CPU's value are both
    // multiples of Z's ulp), and the CPU's f32 of Z (its f64 errors, below
    // 2^-40 relative where |Z| >= 2^-24, aside) within half an ulp of Z.
    // Two f32 a binade apart at most differ by whole or half ulps of the
    // larger, so the bound against the CPU rounds down to one of those.
    let (er, ec) = (log.rel[1] * 2f64.powi(-24), trig.rel[0].max(trig.rel[1]) * 2f64.powi(-24));
    let exact = 0.5 + (er + ec + er * ec) * 2f64.powi(24);
    let cpu = exact + 0.5;
    println!(
        "standard normal: within {exact:.4} ulps of the exact value, {cpu:.4} of the CPU's f32, \
         so at most {} (whole or half ulps)",
        (cpu * 2.0).floor() / 2.0
    );
}
