//! Views of the eager front end against a reference on strided buffers: random chains of
//! view ops (transpose, permute, narrow, select, slicing with steps, unsqueeze, squeeze,
//! expand, diagonal, view, reshape, flatten, indexing) applied both to an `Array` and to a
//! plain strided view of a `Vec`, over random shapes (0-d and empty ones among them) and
//! every dtype, on `cpu:0` and `mock:0`; writes through a view (`fill_`, `add_`, `copy_`,
//! index assignment) land in the base where the reference puts them; and broadcasting
//! arithmetic with PyTorch's promotion gives the reference's values and dtype.

use eagervm::eager::{Array, Context, TensorIndex as I};
use eagervm::ep::mock::MockConfig;
use eagervm::framework::{bf16, f16, Element};
use eagervm::prelude::*;
use proptest::prelude::*;

use crate::common;

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
}

/// A strided view of a buffer of `f64`s: the reference.
#[derive(Debug, Clone)]
struct Ref {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

impl Ref {
    fn contiguous(shape: &[usize]) -> Ref {
        let mut strides = vec![1isize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1].max(1) as isize;
        }
        Ref { shape: shape.to_vec(), strides, offset: 0 }
    }
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The storage indices of the elements, row-major.
    fn indices(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.numel());
        let mut idx = vec![0usize; self.shape.len()];
        for _ in 0..self.numel() {
            let at = self.offset as isize
                + idx.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
            out.push(at as usize);
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
}

/// One view op, with its arguments drawn from raw numbers.
#[derive(Debug, Clone, Copy)]
struct Op(u8, u8, u8, u8);

/// Apply `op` to the array and the reference alike, if it applies to a tensor of this
/// shape; `None` when it does not (both sides then refuse it: checked).
fn apply(a: &Array, r: &Ref, Op(kind, x, y, z): Op) -> Option<(Array, Ref)> {
    let n = r.shape.len();
    let d = |v: u8| if n == 0 { 0 } else { v as usize % n };
    let mut out = r.clone();
    let arr = match kind % 11 {
        0 if n >= 2 => {
            let (i, j) = (d(x), d(y));
            out.shape.swap(i, j);
            out.strides.swap(i, j);
            a.transpose(i as isize, j as isize - n as isize)
        }
        1 if n >= 1 => {
            // A rotation of the dimensions.
            let k = x as usize % n;
            let perm: Vec<usize> = (0..n).map(|i| (i + k) % n).collect();
            out.shape = perm.iter().map(|&p| r.shape[p]).collect();
            out.strides = perm.iter().map(|&p| r.strides[p]).collect();
            a.permute(&perm.iter().map(|&p| p as isize).collect::<Vec<_>>())
        }
        2 if n >= 1 => {
            let i = d(x);
            let size = r.shape[i];
            let start = if size == 0 { 0 } else { y as usize % (size + 1) };
            let len = if size - start == 0 { 0 } else { z as usize % (size - start + 1) };
            out.shape[i] = len;
            if len > 0 {
                out.offset = (r.offset as isize + start as isize * r.strides[i]) as usize;
            }
            a.narrow(i as isize, start as isize, len)
        }
        3 if n >= 1 && r.shape[d(x)] > 0 => {
            let i = d(x);
            let k = y as usize % r.shape[i];
            out.offset = (r.offset as isize + k as isize * r.strides[i]) as usize;
            out.shape.remove(i);
            out.strides.remove(i);
            // A negative index counts from the end.
            a.select(i as isize, k as isize - r.shape[i] as isize)
        }
        4 if n >= 1 => {
            let i = d(x);
            let size = r.shape[i];
            let step = 1 + z as usize % 3;
            let start = y as usize % (size + 2);
            let s = start.min(size);
            let len = if size > s { (size - s).div_ceil(step) } else { 0 };
            out.shape[i] = len;
            out.strides[i] = r.strides[i] * step as isize;
            if len > 0 {
                out.offset = (r.offset as isize + s as isize * r.strides[i]) as usize;
            }
            let mut idx = vec![I::full(); n];
            idx[i] = I::slice(Some(start as isize), None, step as isize);
            a.index(&idx)
        }
        5 if n < 4 => {
            let i = x as usize % (n + 1);
            let stride = if i < n { r.strides[i] * r.shape[i] as isize } else { 1 };
            out.shape.insert(i, 1);
            out.strides.insert(i, stride);
            a.unsqueeze(i as isize)
        }
        6 => {
            let keep: Vec<usize> = (0..n).filter(|&i| r.shape[i] != 1).collect();
            out.shape = keep.iter().map(|&i| r.shape[i]).collect();
            out.strides = keep.iter().map(|&i| r.strides[i]).collect();
            a.squeeze()
        }
        7 if n >= 1 && r.shape.contains(&1) => {
            let i = r.shape.iter().position(|&s| s == 1).expect("a size-1 dimension");
            let to = 1 + x as usize % 3;
            out.shape[i] = to;
            out.strides[i] = 0;
            let mut sizes: Vec<isize> = vec![-1; n];
            sizes[i] = to as isize;
            a.expand(&sizes)
        }
        8 if n >= 2 => {
            let (i, j) = (d(x), (d(x) + 1 + y as usize % (n - 1)) % n);
            let off = (z % 3) as isize - 1;
            let (si, sj) = (r.shape[i] as isize, r.shape[j] as isize);
            let len = if off >= 0 { si.min(sj - off).max(0) } else { (si + off).min(sj).max(0) };
            let start = if len == 0 {
                0
            } else if off >= 0 {
                off * r.strides[j]
            } else {
                -off * r.strides[i]
            };
            let rest: Vec<usize> = (0..n).filter(|&k| k != i && k != j).collect();
            out.shape = rest.iter().map(|&k| r.shape[k]).chain([len as usize]).collect();
            out.strides = rest.iter().map(|&k| r.strides[k]).chain([r.strides[i] + r.strides[j]]).collect();
            out.offset = (r.offset as isize + start) as usize;
            a.diagonal(off, i as isize, j as isize)
        }
        9 => {
            // reshape to the flat shape, then back: values in row-major order either way.
            let flat = a.reshape(&[-1]).ok()?;
            let back: Vec<isize> = r.shape.iter().map(|&s| s as isize).collect();
            let back = flat.reshape(&back).ok()?;
            return Some((back, r.clone()));
        }
        10 if n >= 2 => {
            // flatten the first two dimensions: a view when they are contiguous together.
            let merged = a.flatten(0, 1).ok()?;
            return Some((merged.unflatten(0, &[r.shape[0] as isize, r.shape[1] as isize]).ok()?, r.clone()));
        }
        _ => return None,
    };
    Some((arr.expect("an op the reference takes applies to the array"), out))
}

/// Values `0, 1, 2, ...` as dtype `T` (small integers: exact in every dtype but `bool`,
/// whose values alternate).
fn values<T: Element>(n: usize, conv: impl Fn(usize) -> T) -> Vec<T> {
    (0..n).map(conv).collect()
}

/// Read an array as `f64`s in row-major order, whatever its dtype.
fn read(a: &Array) -> Vec<f64> {
    match a.dtype() {
        DType::F32 => a.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
        DType::F64 => a.to_vec::<f64>().unwrap(),
        DType::F16 => a.to_vec::<f16>().unwrap().into_iter().map(f64::from).collect(),
        DType::BF16 => a.to_vec::<bf16>().unwrap().into_iter().map(f64::from).collect(),
        DType::I32 => a.to_vec::<i32>().unwrap().into_iter().map(f64::from).collect(),
        DType::I64 => a.to_vec::<i64>().unwrap().into_iter().map(|v| v as f64).collect(),
        DType::U8 => a.to_vec::<u8>().unwrap().into_iter().map(f64::from).collect(),
        DType::Bool => a.to_vec::<bool>().unwrap().into_iter().map(|b| f64::from(u8::from(b))).collect(),
    }
}

/// An array of `shape` and `dtype` on `dev` holding `0, 1, 2, ...` (0, 1, 0, ... for `bool`),
/// and those values as `f64`s.
fn base(cx: &Context, shape: &[usize], dtype: DType, dev: DeviceId) -> (Array, Vec<f64>) {
    let n: usize = shape.iter().product();
    let a = match dtype {
        DType::F32 => cx.from_slice(&values(n, |i| i as f32), shape, dev),
        DType::F64 => cx.from_slice(&values(n, |i| i as f64), shape, dev),
        DType::F16 => cx.from_slice(&values(n, |i| f16::from_f32(i as f32)), shape, dev),
        DType::BF16 => cx.from_slice(&values(n, |i| bf16::from_f32(i as f32)), shape, dev),
        DType::I32 => cx.from_slice(&values(n, |i| i as i32), shape, dev),
        DType::I64 => cx.from_slice(&values(n, |i| i as i64), shape, dev),
        DType::U8 => cx.from_slice(&values(n, |i| i as u8), shape, dev),
        DType::Bool => cx.from_slice(&values(n, |i| i % 2 == 1), shape, dev),
    }
    .unwrap();
    let v = read(&a);
    (a, v)
}

fn shapes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 0..=4)
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(any::<(u8, u8, u8, u8)>().prop_map(|(a, b, c, d)| Op(a, b, c, d)), 0..6)
}

proptest! {
    #![proptest_config(common::proptest_config(64))]

    /// A chain of views reads the elements the reference names, and a fill through the
    /// last view writes exactly those elements of the base.
    #[test]
    fn chains_of_views_match_the_reference(shape in shapes(), chain in ops(), dt in 0usize..8, on_mock: bool) {
        let vm = vm();
        let cx = Context::new(&vm);
        let dtype = DType::ALL[dt];
        let dev = if on_mock { DeviceId::mock(0) } else { DeviceId::CPU };
        let (a, data) = base(&cx, &shape, dtype, dev);
        let (mut v, mut r) = (a.clone(), Ref::contiguous(&shape));
        for op in chain {
            if let Some((nv, nr)) = apply(&v, &r, op) {
                prop_assert_eq!(nv.shape(), nr.shape.as_slice(), "{:?}", op);
                v = nv;
                r = nr;
            }
        }
        let want: Vec<f64> = r.indices().iter().map(|&i| data[i]).collect();
        prop_assert_eq!(read(&v), want);
        // A write through the view (when it names each element once) lands in the base.
        // (`reshape` and `flatten` copy where no view exists: then the chain left the base.)
        let once = { let mut i = r.indices(); i.sort_unstable(); i.windows(2).all(|w| w[0] != w[1]) };
        if once && (v.shares_storage(&a) || r.numel() == 0) {
            let mut w = v.clone();
            w.fill_(1)?;
            let mut expect = data.clone();
            for i in r.indices() {
                expect[i] = 1.0;
            }
            prop_assert_eq!(read(&a), expect);
        }
    }
}

#[test]
fn writes_through_views_land_in_the_base() {
    let vm = vm();
    let cx = Context::new(&vm);
    for dev in [DeviceId::CPU, DeviceId::mock(0)] {
        let x = cx.from_slice(&(0..12).map(|i| i as f32).collect::<Vec<_>>(), &[3, 4], dev).unwrap();
        // x[:, 1::2] += 100 (in place, through a strided view)
        let mut odd = x.index(&[I::full(), I::slice(Some(1), None, 2)]).unwrap();
        odd.add_(100.0).unwrap();
        // x[0] = [-1, -2, -3, -4] (index assignment with an array)
        let row = cx.from_slice(&[-1.0f32, -2.0, -3.0, -4.0], &[4], dev).unwrap();
        x.index_put_(&[I::at(0)], &row).unwrap();
        // x.t()[3] = 7 (a column through the transpose), then x[2, :2] *= 2
        x.t().unwrap().index_put_(&[I::at(3)], 7.0).unwrap();
        x.index(&[I::at(2), I::range(None, Some(2))]).unwrap().mul_(2).unwrap();
        assert_eq!(
            x.to_vec::<f32>().unwrap(),
            [-1.0, -2.0, -3.0, 7.0, 4.0, 105.0, 6.0, 7.0, 16.0, 218.0, 10.0, 7.0],
            "{dev}"
        );
        // copy_ broadcasts and casts: a row of i64 into every row.
        let mut y = cx.zeros(&[2, 3], DType::F32, dev).unwrap();
        y.copy_(&cx.from_slice(&[1i64, 2, 3], &[3], dev).unwrap()).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }
}

#[test]
fn broadcasting_arithmetic_promotes_as_pytorch() {
    let vm = vm();
    let cx = Context::new(&vm);
    let a = cx.from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3], DeviceId::CPU).unwrap();
    let b = cx.from_slice(&[0.5f32, 1.0, 2.0], &[3], DeviceId::CPU).unwrap();
    let s = a.add(&b).unwrap();
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(s.to_vec::<f32>().unwrap(), [1.5, 3.0, 5.0, 4.5, 6.0, 8.0]);
    // An integer scalar keeps i32; a float scalar makes f32; division is true division.
    assert_eq!(a.mul(3).unwrap().dtype(), DType::I32);
    assert_eq!(a.mul(0.5).unwrap().to_vec::<f32>().unwrap(), [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    assert_eq!(a.div(2).unwrap().to_vec::<f32>().unwrap(), [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    assert_eq!(a.rsub(10).unwrap().to_vec::<i32>().unwrap(), [9, 8, 7, 6, 5, 4]);
    // Comparisons give bool arrays, broadcasting a column against a row.
    let col = cx.from_slice(&[2i32, 5], &[2, 1], DeviceId::CPU).unwrap();
    assert_eq!(a.ge(&col).unwrap().to_vec::<bool>().unwrap(), [false, true, true, false, true, true]);
    assert_eq!(a.gt(2.5).unwrap().to_vec::<bool>().unwrap(), [false, false, true, true, true, true]);
    // f16 with a float scalar stays f16; f16 with bf16 is f32.
    let h = cx.full(&[2], 1.5, DType::F16, DeviceId::CPU).unwrap();
    assert_eq!(h.mul(2.0).unwrap().dtype(), DType::F16);
    let g = cx.full(&[2], 1.0, DType::BF16, DeviceId::CPU).unwrap();
    assert_eq!(h.add(&g).unwrap().dtype(), DType::F32);
    // In place keeps the array's dtype, and refuses a result it cannot hold.
    let mut ints = a.copy().unwrap();
    assert!(matches!(ints.add_(0.5), Err(Error::InvalidOperands { .. })));
    let mut f = b.copy().unwrap();
    f.add_(&cx.from_slice(&[1i64, 1, 1], &[3], DeviceId::CPU).unwrap()).unwrap();
    assert_eq!(f.to_vec::<f32>().unwrap(), [1.5, 2.0, 3.0]);
    // A bad broadcast names both shapes.
    let bad = cx.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    match b.add(&bad) {
        Err(Error::InvalidOperands { detail, .. }) => {
            assert!(detail.contains("[3]") && detail.contains("[2]"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_views_are_typed_errors_naming_the_op() {
    let vm = vm();
    let cx = Context::new(&vm);
    let x = cx.zeros(&[2, 3], DType::F32, DeviceId::CPU).unwrap();
    let op = |r: Result<Array>| match r {
        Err(Error::InvalidOperands { op, .. }) => op,
        other => panic!("{other:?}"),
    };
    assert_eq!(op(x.view(&[4, -1])), "view");
    assert_eq!(op(x.t().unwrap().view(&[6])), "view");
    assert_eq!(op(x.transpose(0, 2)), "transpose");
    assert_eq!(op(x.narrow(1, 2, 2)), "narrow");
    assert_eq!(op(x.select(0, 2)), "select");
    assert_eq!(op(x.expand(&[4, 3])), "expand");
    assert_eq!(op(x.index(&[I::at(0), I::at(0), I::at(0)])), "index");
    assert_eq!(op(x.slice(1, None, None, 0)), "slice");
    assert_eq!(op(x.as_strided(&[3, 3], &[3, 1], 0)), "as_strided");
    // reshape copies where view cannot.
    let y = x.t().unwrap().reshape(&[6]).unwrap();
    assert!(!y.shares_storage(&x));
    vm.sync().unwrap();
}
