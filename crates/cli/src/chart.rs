//! Line charts as PNG files (plotters). Text needs a TrueType font: the
//! first of a few common system fonts is used, and without one the chart is
//! drawn with no text rather than not at all.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// Registers a system font for chart text once; false when none was found.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        for path in FONTS {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// One line of a chart.
#[derive(Default)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
}

/// A vertical line across a panel, labelled in the legend: where one phase
/// of a run ends and the next begins.
pub struct Marker {
    /// Where, on the x axis.
    pub x: f64,
    /// Legend label.
    pub label: String,
}

/// One panel: a title, axis labels and lines.
#[derive(Default)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// y-axis label.
    pub y_label: String,
    /// Lines to draw.
    pub series: Vec<Series>,
    /// Plot y on a log scale.
    pub log_y: bool,
    /// x counts something (iterations, steps): ticks at whole numbers only.
    pub integer_x: bool,
    /// Vertical marker lines.
    pub markers: Vec<Marker>,
}

/// A number as an axis tick or a figure in a title: at most three
/// significant digits, plainly between 0.0001 and 100,000 and in
/// scientific notation (`2.5e-5`) outside, so a log axis reads `1e-5`,
/// never the float noise `9999999999e-5`.
pub fn tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v == 0.0 {
            "0".into()
        } else {
            format!("{v}")
        };
    }
    let a = v.abs();
    if !(1e-4..1e5).contains(&a) {
        let s = format!("{v:.2e}");
        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
        let m = if m.contains('.') { m.trim_end_matches('0').trim_end_matches('.') } else { m };
        return format!("{m}e{e}");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" {
        "0".into()
    } else {
        s
    }
}

/// A figure in the commands' output, in one format everywhere: three
/// significant digits, plain between 0.001 and 100,000 (`0.0123`, `412`)
/// and scientific outside (`6.80e-4`), never Rust's `1.03e0`.
pub fn num(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v == 0.0 {
            "0".into()
        } else {
            format!("{v}")
        };
    }
    let a = v.abs();
    if !(1e-3..1e5).contains(&a) {
        return format!("{v:.2e}");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    format!("{v:.decimals$}")
}

/// A byte count in the unit that suits it (tapir's one format for bytes).
pub fn bytes(b: f64) -> String {
    tapir::tensor::format_bytes(b)
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The data's range over every series, padded so no line runs along the
/// frame: 5% of the span on each side (a factor on a log axis).
fn ranges(panel: &Panel) -> (f64, f64, f64, f64) {
    let pts = panel.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        if !x.is_finite() || !y.is_finite() || (panel.log_y && y <= 0.0) {
            continue;
        }
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    for m in &panel.markers {
        x0 = x0.min(m.x);
        x1 = x1.max(m.x);
    }
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if y0 > y1 {
        (y0, y1) = if panel.log_y { (0.1, 1.0) } else { (0.0, 1.0) };
    }
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    // The top gets more room than the bottom: the legend sits there.
    let legend = 0.13 * (panel.series.len() + panel.markers.len()) as f64 + 0.05;
    if panel.log_y {
        let span = (y1 / y0).max(10.0);
        (y0, y1) = (y0 / span.powf(0.05), y1 * span.powf(legend));
    } else {
        let span = if y1 - y0 < 1e-12 * y1.abs().max(1.0) { y1.abs().max(1.0) } else { y1 - y0 };
        (y0, y1) = (y0 - 0.05 * span, y1 + legend * span);
    }
    let xpad = 0.015 * (x1 - x0);
    (x0 - xpad, x1 + xpad, y0, y1)
}

/// Draws `panels` stacked vertically into a PNG at `path`.
pub fn line_chart(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    let text = font_ready();
    let height = 360 * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (panel, area) in panels.iter().zip(areas) {
        let (x0, x1, y0, y1) = ranges(panel);
        let mut builder = ChartBuilder::on(&area);
        // The right margin leaves room for the last x tick's label.
        builder.margin(12).margin_right(36).x_label_area_size(if text { 40 } else { 4 }).y_label_area_size(if text {
            80
        } else {
            4
        });
        if text {
            builder.caption(&panel.title, ("sans-serif", 20));
        }
        // Whole-number ticks only: at most one label per unit.
        let x_ticks = if panel.integer_x { ((x1 - x0).floor() as usize + 1).clamp(2, 10) } else { 10 };
        let x_fmt = |v: &f64| if panel.integer_x { format!("{}", v.round()) } else { tick(*v) };
        let y_fmt = |v: &f64| tick(*v);
        macro_rules! draw {
            ($chart:expr) => {{
                let mut chart = $chart;
                let mut mesh = chart.configure_mesh();
                mesh.x_labels(x_ticks).x_label_formatter(&x_fmt).y_label_formatter(&y_fmt);
                if text {
                    mesh.x_desc(panel.x_label.as_str()).y_desc(panel.y_label.as_str());
                } else {
                    mesh.disable_x_axis().disable_y_axis();
                }
                mesh.draw()?;
                for (i, s) in panel.series.iter().enumerate() {
                    let c = COLORS[i % COLORS.len()];
                    let keep = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!panel.log_y || y > 0.0);
                    let line =
                        chart.draw_series(LineSeries::new(s.points.iter().copied().filter(keep), c.stroke_width(2)))?;
                    if text {
                        line.label(s.label.clone())
                            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
                    }
                }
                for m in &panel.markers {
                    let style = BLACK.mix(0.6).stroke_width(1);
                    let dashes = (0..40).map(|k| {
                        let t = |j: f64| y0 + (y1 - y0) * j / 40.0;
                        let (a, b) = if panel.log_y {
                            let l = |j: f64| (y0.ln() + (y1.ln() - y0.ln()) * j / 40.0).exp();
                            (l(k as f64), l(k as f64 + 0.5))
                        } else {
                            (t(k as f64), t(k as f64 + 0.5))
                        };
                        PathElement::new(vec![(m.x, a), (m.x, b)], style)
                    });
                    let drawn = chart.draw_series(dashes)?;
                    if text {
                        drawn.label(m.label.clone()).legend(move |(x, y)| {
                            PathElement::new(vec![(x + 10, y - 6), (x + 10, y + 6)], BLACK.mix(0.6).stroke_width(1))
                        });
                    }
                }
                if text {
                    chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::UpperRight)
                        .background_style(WHITE.mix(0.85))
                        .border_style(BLACK)
                        .draw()?;
                }
            }};
        }
        if panel.log_y {
            draw!(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?);
        } else {
            draw!(builder.build_cartesian_2d(x0..x1, y0..y1)?);
        }
    }
    root.present()?;
    Ok(())
}

/// Draws one horizontal bar per `(label, value)` with a vertical reference
/// line at `reference` (1.0 for ratios), into a PNG at `path`. Bars start at
/// the reference, so a bar to the left reads "below" and one to the right
/// "above"; each is labelled with its value.
pub fn bar_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    bars: &[(String, f64)],
    reference: f64,
) -> anyhow::Result<()> {
    if bars.is_empty() {
        return Ok(());
    }
    let text = font_ready();
    let n = bars.len();
    let height = 120 + 34 * n as u32;
    let root = BitMapBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let finite: Vec<f64> = bars.iter().map(|b| b.1).filter(|v| v.is_finite() && *v > 0.0).collect();
    let hi = finite.iter().copied().fold(reference, f64::max) * 1.6;
    // At least a decade below the reference, so the axis has two labels.
    let lo = (finite.iter().copied().fold(reference, f64::min) / 1.5).min(reference / 10.0);
    let mut builder = ChartBuilder::on(&root);
    builder.margin(12).margin_right(36).x_label_area_size(if text { 40 } else { 4 }).y_label_area_size(if text {
        210
    } else {
        4
    });
    if text {
        builder.caption(title, ("sans-serif", 20));
    }
    // n segments, 0..=n-1; the top edge of the last is `Last`.
    let mut chart = builder.build_cartesian_2d((lo..hi).log_scale(), (0..n - 1).into_segmented())?;
    // Row i from the bottom is bar n - 1 - i, so the first bar is on top.
    let name = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) if *i < n => bars[n - 1 - i].0.clone(),
        _ => String::new(),
    };
    let mut mesh = chart.configure_mesh();
    // Few x labels: a log axis given many crowds them below each decade.
    mesh.disable_y_mesh().y_labels(n).y_label_formatter(&name).x_labels(5).x_label_formatter(&|v| tick(*v));
    if text {
        mesh.x_desc(x_label);
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    for (k, (_, v)) in bars.iter().enumerate() {
        if !v.is_finite() || *v <= 0.0 {
            continue;
        }
        let row = n - 1 - k;
        let color = if *v <= reference { COLORS[2] } else { COLORS[1] };
        let top = if row + 1 == n { SegmentValue::Last } else { SegmentValue::Exact(row + 1) };
        let mut bar = Rectangle::new(
            [(reference.min(*v), SegmentValue::Exact(row)), (reference.max(*v), top)],
            color.mix(0.8).filled(),
        );
        bar.set_margin(6, 6, 0, 0);
        chart.draw_series(std::iter::once(bar))?;
        if text {
            // The figure sits at the bar's outer end: inside a bar that
            // reaches left (towards the axis), outside one that reaches right.
            chart.draw_series(std::iter::once(Text::new(
                format!(" {}x ", tick(*v)),
                (*v, SegmentValue::CenterOf(row)),
                ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
            )))?;
        }
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(reference, SegmentValue::Exact(0)), (reference, SegmentValue::Last)],
        BLACK.stroke_width(2),
    )))?;
    root.present()?;
    Ok(())
}

/// A scalar field on a regular grid, for [`heatmaps`].
pub struct Field {
    /// Panel title.
    pub title: String,
    /// Values, row-major: `ny` rows (y from low to high) of `nx` columns.
    pub values: Vec<f64>,
    /// Columns.
    pub nx: usize,
    /// Rows.
    pub ny: usize,
    /// x range.
    pub x: (f64, f64),
    /// y range.
    pub y: (f64, f64),
    /// Axis labels.
    pub labels: (String, String),
}

/// A perceptual blue-to-yellow colour map (viridis-like), t in [0, 1].
fn colormap(t: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] =
        [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 } * (STOPS.len() - 1) as f64;
    let i = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Draws fields side by side as heat maps, each with its value range in the
/// title, into a PNG at `path`.
pub fn heatmaps(path: &Path, fields: &[Field]) -> anyhow::Result<()> {
    let text = font_ready();
    let root = BitMapBackend::new(path, (460 * fields.len().max(1) as u32, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    for (f, area) in fields.iter().zip(root.split_evenly((1, fields.len().max(1)))) {
        let (lo, hi) =
            f.values.iter().filter(|v| v.is_finite()).fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let span = if hi > lo { hi - lo } else { 1.0 };
        let mut b = ChartBuilder::on(&area);
        b.margin(10).x_label_area_size(if text { 30 } else { 2 }).y_label_area_size(if text { 40 } else { 2 });
        if text {
            b.caption(format!("{} [{}, {}]", f.title, tick(lo), tick(hi)), ("sans-serif", 16));
        }
        let mut chart = b.build_cartesian_2d(f.x.0..f.x.1, f.y.0..f.y.1)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc(f.labels.0.as_str()).y_desc(f.labels.1.as_str());
        } else {
            mesh.disable_x_axis().disable_y_axis();
        }
        mesh.disable_mesh().draw()?;
        let (dx, dy) = ((f.x.1 - f.x.0) / f.nx as f64, (f.y.1 - f.y.0) / f.ny as f64);
        chart.draw_series((0..f.ny).flat_map(|j| (0..f.nx).map(move |i| (i, j))).map(|(i, j)| {
            let v = f.values[j * f.nx + i];
            let (x0, y0) = (f.x.0 + i as f64 * dx, f.y.0 + j as f64 * dy);
            Rectangle::new([(x0, y0), (x0 + dx, y0 + dy)], colormap((v - lo) / span).filled())
        }))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{bytes, num, tick};

    #[test]
    fn figures_have_one_format() {
        assert_eq!(num(1.03), "1.03");
        assert_eq!(num(0.000_68), "6.80e-4");
        assert_eq!(num(412.3), "412");
        assert_eq!(num(123_456.0), "1.23e5");
        assert_eq!(tick(0.999_999_999_9e-4), "1e-4");
        assert_eq!(tick(0.000_5), "0.0005");
        assert_eq!(tick(2.5e-5), "2.5e-5");
        assert_eq!(tick(20.0), "20");
        assert_eq!(tick(-0.0), "0");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(92_300.0), "90.14 KiB");
        assert_eq!(bytes(131_072_000.0), "125.00 MiB");
    }
}
