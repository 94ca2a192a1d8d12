//! The data loader: every sample once per epoch, rows kept with their
//! labels, orders fixed by the seed and epoch, and bad input as errors.

use tapir_nn::DataLoader;
use tapir_tensor::prelude::*;

fn data(n: usize) -> (Tensor, Tensor) {
    let x = Tensor::arange(0.0, (3 * n) as f64, 1.0, DType::F32).unwrap().reshape([n, 3]).unwrap();
    let y = Tensor::arange(0.0, n as f64, 1.0, DType::I64).unwrap();
    (x, y)
}

fn labels(loader: &DataLoader, epoch: u64) -> Vec<Vec<i64>> {
    loader.epoch(epoch).map(|b| b.unwrap()[1].to_vec::<i64>().unwrap()).collect()
}

#[test]
fn batches_cover_every_sample_and_keep_rows_with_labels() {
    let (x, y) = data(10);
    for (loader, sizes) in [
        (DataLoader::new(&[&x, &y], 4).unwrap(), vec![4, 4, 2]),
        (DataLoader::new(&[&x, &y], 4).unwrap().drop_last(true), vec![4, 4]),
        (DataLoader::new(&[&x, &y], 3).unwrap().shuffle(1), vec![3, 3, 3, 1]),
    ] {
        assert_eq!(loader.num_batches(), sizes.len());
        assert_eq!(loader.epoch(0).len(), sizes.len());
        let mut all = Vec::new();
        for (b, want) in loader.epoch(0).zip(&sizes) {
            let b = b.unwrap();
            assert_eq!(b[0].dims(), &[*want, 3]);
            let (xs, ys) = (b[0].to_vec::<f32>().unwrap(), b[1].to_vec::<i64>().unwrap());
            for (row, label) in xs.chunks(3).zip(&ys) {
                assert_eq!(row, &[3.0 * *label as f32, 3.0 * *label as f32 + 1.0, 3.0 * *label as f32 + 2.0]);
            }
            all.extend(ys);
        }
        all.sort();
        let expect: Vec<i64> = (0..sizes.iter().sum::<usize>() as i64).collect();
        if sizes.iter().sum::<usize>() == 10 {
            assert_eq!(all, expect);
        }
    }
}

#[test]
fn shuffled_orders_depend_on_seed_and_epoch_only() {
    let (x, y) = data(64);
    let a = DataLoader::new(&[&x, &y], 16).unwrap().shuffle(3);
    let b = DataLoader::new(&[&x, &y], 16).unwrap().shuffle(3);
    let c = DataLoader::new(&[&x, &y], 16).unwrap().shuffle(4);
    assert_eq!(labels(&a, 0), labels(&b, 0));
    assert_ne!(labels(&a, 0), labels(&a, 1), "epochs must differ");
    assert_ne!(labels(&a, 0), labels(&c, 0), "seeds must differ");
    let in_order: Vec<i64> = (0..64).collect();
    assert_ne!(labels(&a, 0).concat(), in_order);
    let plain = DataLoader::new(&[&x, &y], 16).unwrap();
    assert_eq!(labels(&plain, 5).concat(), in_order);
}

#[test]
fn bad_input_is_an_error() {
    let (x, y) = data(10);
    let short = Tensor::zeros([9], DType::I64).unwrap();
    let msg = DataLoader::new(&[&x, &short], 2).unwrap_err().to_string();
    assert!(msg.contains("tensor 0 has 10 samples but tensor 1 has 9"), "{msg}");
    assert!(DataLoader::new(&[&x, &y], 0).is_err());
    assert!(DataLoader::new(&[], 2).is_err());
    assert!(DataLoader::new(&[&Tensor::scalar(1.0)], 2).is_err());
}
