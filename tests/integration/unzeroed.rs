//! Outputs on blocks that earlier tensors left dirty: a call whose kernel writes its outputs
//! whole takes a cached block without zeroing it (`alloc::request`, "Unzeroed blocks"), and
//! must hold exactly its result; a first write of part of a storage still reads zeros
//! elsewhere.

use eagervm::eager::{Array, Context};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
}

const DEVICES: [DeviceId; 2] = [DeviceId::CPU, DeviceId::mock(0)];

const ROWS: usize = 64;
const COLS: usize = 48;

/// Deterministic values of both signs, a NaN and an infinity among them.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match i {
                5 => f32::NAN,
                77 => f32::INFINITY,
                _ => ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0,
            }
        })
        .collect()
}

/// An op's output shape, and the op.
type Op<'a> = (&'a [usize], Box<dyn Fn() -> Array + 'a>);

/// The ops' results as bits, on `cx`'s `dev`: before each op, an array of the op's output
/// size is filled with `dirt` and dropped, so that the output may take its block.
fn results(cx: &Context, dev: DeviceId, dirt: Option<f32>) -> Vec<Vec<u32>> {
    let x = cx.from_slice(&values(ROWS * COLS, 1), &[ROWS, COLS], dev).unwrap();
    let y = cx.from_slice(&values(ROWS * COLS, 2), &[ROWS, COLS], dev).unwrap();
    let w = cx.from_slice(&values(COLS * 8, 3), &[COLS, 8], dev).unwrap();
    let ops: Vec<Op<'_>> = vec![
        (&[ROWS, COLS], Box::new(|| x.softmax(-1).unwrap())),
        (&[ROWS, COLS], Box::new(|| x.log_softmax(-1).unwrap())),
        (&[ROWS, COLS], Box::new(|| x.layer_norm(&[COLS], None, None, 1e-5).unwrap())),
        (&[ROWS, COLS], Box::new(|| x.exp().unwrap())),
        (&[ROWS, COLS], Box::new(|| x.add(&y).unwrap())),
        (&[ROWS, 8], Box::new(|| x.matmul(&w).unwrap())),
        (&[COLS], Box::new(|| x.sum_dim(&[0], false).unwrap())),
        (&[ROWS, COLS], Box::new(|| cx.zeros(&[ROWS, COLS], DType::F32, dev).unwrap())),
    ];
    ops.iter()
        .map(|(shape, op)| {
            if let Some(v) = dirt {
                let d = cx.full(shape, f64::from(v), DType::F32, dev).unwrap();
                d.wait().unwrap();
                drop(d);
                cx.sync().unwrap();
            }
            let out = op();
            out.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
        })
        .collect()
}

#[test]
fn outputs_on_dirty_blocks_hold_exactly_the_ops_results() {
    for dev in DEVICES {
        let fresh = results(&Context::new(&vm()), dev, None);
        let vm = vm();
        let cx = Context::new(&vm);
        for dirt in [f32::NAN, -1.5e30, 0.0] {
            assert_eq!(results(&cx, dev, Some(dirt)), fresh, "on {dev}, after {dirt}");
        }
    }
}

/// `x = empty([6]); x[4:] = 5` reads `[0, 0, 0, 0, 5, 5]` even where the storage's block
/// held other values: a first write of part of a storage allocates it zeroed.
#[test]
fn a_first_write_of_part_of_a_storage_reads_zeros_elsewhere_on_a_dirty_block() {
    let vm = vm();
    let cx = Context::new(&vm);
    for dev in DEVICES {
        for _ in 0..3 {
            let d = cx.full(&[6], 9.0, DType::F32, dev).unwrap();
            d.wait().unwrap();
            drop(d);
            cx.sync().unwrap();
            let x = cx.empty(&[6], DType::F32, dev).unwrap();
            x.slice(0, Some(4), None, 1).unwrap().fill_(5.0).unwrap();
            let got = x.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(got, [0.0, 0.0, 0.0, 0.0, 5.0, 5.0], "on {dev}");
        }
    }
}
