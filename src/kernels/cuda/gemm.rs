//! The arguments of the cuBLAS call behind `matmul`, `matmul_tn` and `matmul_nt`, taken
//! from the operands' strides: a pure function of the op, its sizes and the three layouts,
//! so that the derivation is checked on the host.
//!
//! # Derivation
//!
//! cuBLAS is column-major: `gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc)` computes the
//! `M × N` matrix `C = op(A) op(B)`, where `op(X)` is `X` (`N`) or `Xᵀ` (`T`), `op(A)` is
//! `M × K` and `op(B)` is `K × N`; element `(i, j)` of a stored column-major matrix with
//! leading dimension `ld` is at `i + j·ld`, and `ld` must be at least the stored matrix's
//! row count (and at least 1).
//!
//! A matrix `X` of `r × c` elements with row stride `rs` and column stride `cs` (element
//! `(i, j)` at `i·rs + j·cs`) is such a stored matrix when one of its strides is 1
//! ([`operand`]):
//!
//! - `rs = 1`: `X` itself is column-major with `ld = cs`: flag `N`;
//! - `cs = 1`: read column-major with `ld = rs`, the stored `c × r` matrix is `Xᵀ`, so `X`
//!   is `op(Xᵀ)` with flag `T`.
//!
//! A dimension of size 1 may have any stride (it is never stepped along), and a leading
//! dimension below the row count (a broadcast stride of 0, overlapping rows) or a negative
//! stride fits neither: such an operand goes through a contiguous copy first.
//!
//! Each product is `C = L R` with `L = op(a)` (`m × k`: `a`, or `aᵀ` for `matmul_tn`) and
//! `R = op(b)` (`k × n`: `b`, or `bᵀ` for `matmul_nt`); transposing a logical matrix swaps
//! its two strides. When `C`'s column stride is 1 (a row-major output, the usual case),
//! `Cᵀ = Rᵀ Lᵀ` is column-major with `ldc` its row stride: cuBLAS's first operand is `Rᵀ`
//! (the op's second input), its second `Lᵀ`, `M = n`, `N = m`. When instead `C`'s row
//! stride is 1 (a transposed output), `C = L R` is computed directly: first operand `L`,
//! second `R`, `M = m`, `N = n`. An output that fits neither is computed into a contiguous
//! temporary and copied.
//!
//! For contiguous operands this gives, with `ldc = n` and `M = n`, `N = m`: `matmul`
//! `(N, N)` with `lda = n`, `ldb = k`; `matmul_tn` `(N, T)` with `lda = n`, `ldb = m`;
//! `matmul_nt` `(T, N)` with `lda = ldb = k`.

/// A transpose flag of a column-major BLAS call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trans {
    /// Use the stored matrix as it is (`CUBLAS_OP_N`).
    N,
    /// Use its transpose (`CUBLAS_OP_T`).
    T,
}

/// A matrix product op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// `matmul`: `a: [m, k]`, `b: [k, n]`, `a b`.
    Nn,
    /// `matmul_tn`: `a: [k, m]`, `b: [k, n]`, `aᵀ b`.
    Tn,
    /// `matmul_nt`: `a: [m, k]`, `b: [n, k]`, `a bᵀ`.
    Nt,
}

impl Product {
    /// Every product, in a fixed order.
    pub const ALL: [Product; 3] = [Product::Nn, Product::Tn, Product::Nt];

    /// The op's name.
    pub fn op(self) -> &'static str {
        match self {
            Product::Nn => "matmul",
            Product::Tn => "matmul_tn",
            Product::Nt => "matmul_nt",
        }
    }

    /// The row-major shapes of the op's inputs for output `[m, n]` and inner size `k`.
    pub fn input_shapes(self, m: usize, n: usize, k: usize) -> ([usize; 2], [usize; 2]) {
        match self {
            Product::Nn => ([m, k], [k, n]),
            Product::Tn => ([k, m], [k, n]),
            Product::Nt => ([m, k], [n, k]),
        }
    }

    /// `(m, n, k)` from the inputs' shapes, or an error when they do not fit this product.
    pub fn dims(self, a: &[usize], b: &[usize]) -> Result<(usize, usize, usize), String> {
        let (&[a0, a1], &[b0, b1]) = (a, b) else {
            return Err(format!("{} takes two matrices, got shapes {a:?} and {b:?}", self.op()));
        };
        let (m, k, k2, n) = match self {
            Product::Nn => (a0, a1, b0, b1),
            Product::Tn => (a1, a0, b0, b1),
            Product::Nt => (a0, a1, b1, b0),
        };
        if k != k2 {
            return Err(format!("{}: shapes {a:?} and {b:?} have different inner sizes", self.op()));
        }
        Ok((m, n, k))
    }

    /// The strides `(row, column)` of `L = op(a)` and `R = op(b)` from the inputs' strides.
    pub fn logical(self, a: [isize; 2], b: [isize; 2]) -> ([isize; 2], [isize; 2]) {
        let swap = |s: [isize; 2]| [s[1], s[0]];
        match self {
            Product::Nn => (a, b),
            Product::Tn => (swap(a), b),
            Product::Nt => (a, swap(b)),
        }
    }
}

/// The op's input a BLAS operand reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Input 0 (`a`).
    First,
    /// Input 1 (`b`).
    Second,
}

/// The arguments of one column-major `gemm` (`alpha = 1`, `beta = 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmArgs {
    /// Transpose flag of the first BLAS operand.
    pub transa: Trans,
    /// Transpose flag of the second BLAS operand.
    pub transb: Trans,
    /// Rows of the column-major result.
    pub m: usize,
    /// Columns of the column-major result.
    pub n: usize,
    /// The inner size.
    pub k: usize,
    /// Which op input is the first BLAS operand.
    pub a: Input,
    /// Its leading dimension.
    pub lda: usize,
    /// Which op input is the second BLAS operand.
    pub b: Input,
    /// Its leading dimension.
    pub ldb: usize,
    /// The result's leading dimension.
    pub ldc: usize,
}

/// An operand that cuBLAS cannot read as it lies: it needs a contiguous copy first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unfit {
    /// Input 0.
    A,
    /// Input 1.
    B,
    /// The output.
    C,
}

/// How cuBLAS reads the `rows × cols` matrix with strides `s = [row, column]` as `op(X)`
/// (see the module docs): the flag and the leading dimension, or `None` when it cannot.
pub fn operand(rows: usize, cols: usize, s: [isize; 2]) -> Option<(Trans, usize)> {
    let fits =
        |stride: isize, at_least: usize| usize::try_from(stride).ok().filter(|&ld| ld >= at_least.max(1));
    if rows <= 1 || s[0] == 1 {
        let ld = if cols <= 1 { Some(rows.max(1)) } else { fits(s[1], rows) };
        if let Some(ld) = ld {
            return Some((Trans::N, ld));
        }
    }
    if cols <= 1 || s[1] == 1 {
        let ld = if rows <= 1 { Some(cols.max(1)) } else { fits(s[0], cols) };
        if let Some(ld) = ld {
            return Some((Trans::T, ld));
        }
    }
    None
}

/// The `gemm` arguments that compute `product` of `a` (strides `sa`) and `b` (strides `sb`)
/// into `c` (strides `sc`), for output `[m, n]` and inner size `k`; or the operand that
/// must be made contiguous first (inputs before the output).
pub fn gemm_args(
    product: Product,
    (m, n, k): (usize, usize, usize),
    sa: [isize; 2],
    sb: [isize; 2],
    sc: [isize; 2],
) -> Result<GemmArgs, Unfit> {
    let (l, r) = product.logical(sa, sb);
    let swap = |s: [isize; 2]| [s[1], s[0]];
    // Row-major output: Cᵀ = Rᵀ Lᵀ.
    if let Some((Trans::N, ldc)) = operand(n, m, swap(sc)) {
        let (transa, lda) = operand(n, k, swap(r)).ok_or(Unfit::B)?;
        let (transb, ldb) = operand(k, m, swap(l)).ok_or(Unfit::A)?;
        return Ok(GemmArgs {
            transa,
            transb,
            m: n,
            n: m,
            k,
            a: Input::Second,
            lda,
            b: Input::First,
            ldb,
            ldc,
        });
    }
    // Column-major output: C = L R.
    if let Some((Trans::N, ldc)) = operand(m, n, sc) {
        let (transa, lda) = operand(m, k, l).ok_or(Unfit::A)?;
        let (transb, ldb) = operand(k, n, r).ok_or(Unfit::B)?;
        return Ok(GemmArgs { transa, transb, m, n, k, a: Input::First, lda, b: Input::Second, ldb, ldc });
    }
    Err(Unfit::C)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference column-major `gemm` with `alpha = 1`, `beta = 0`, following the BLAS
    /// definition, with cuBLAS's argument checks; each element adds its products in
    /// increasing `p`. It writes only the `m × n` elements of `c` the call names.
    fn gemm(g: &GemmArgs, a: &[f32], b: &[f32], c: &mut [f32]) -> Result<(), String> {
        let (m, n, k) = (g.m, g.n, g.k);
        let rows_a = if g.transa == Trans::N { m } else { k };
        let rows_b = if g.transb == Trans::N { k } else { n };
        if g.lda < rows_a.max(1) || g.ldb < rows_b.max(1) || g.ldc < m.max(1) {
            return Err(format!("leading dimension too small: {g:?}"));
        }
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f32;
                for p in 0..k {
                    let x = if g.transa == Trans::N { a[i + p * g.lda] } else { a[p + i * g.lda] };
                    let y = if g.transb == Trans::N { b[p + j * g.ldb] } else { b[j + p * g.ldb] };
                    acc += x * y;
                }
                c[i + j * g.ldc] = acc;
            }
        }
        Ok(())
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 4001) as f32 / 1000.0 - 2.0
            })
            .collect()
    }

    /// A `rows × cols` matrix laid out in a buffer by `layout`: 0 row-major, 1 transposed
    /// (column-major), 2 row-major with padded rows; with its strides. Unused elements NaN.
    fn place(rows: usize, cols: usize, values: &[f32], layout: u8) -> (Vec<f32>, [isize; 2]) {
        let (rs, cs, len) = match layout {
            0 => (cols, 1, rows * cols),
            1 => (1, rows, rows * cols),
            _ => (cols + 3, 1, rows * (cols + 3)),
        };
        let mut buf = vec![f32::NAN; len.max(1)];
        for i in 0..rows {
            for j in 0..cols {
                buf[i * rs + j * cs] = values[i * cols + j];
            }
        }
        (buf, [rs as isize, cs as isize])
    }

    /// Every product, on every combination of row-major, transposed and padded inputs
    /// and outputs, computed with the derived arguments by the reference `gemm`, equals
    /// the plain product bit for bit (each element adds its products in increasing `p`).
    #[test]
    fn gemm_arguments_from_strides_compute_the_products() {
        for product in Product::ALL {
            for (m, n, k) in [(3, 5, 7), (5, 3, 2), (1, 4, 3), (4, 1, 6), (2, 3, 1), (6, 6, 6), (1, 1, 9)] {
                let (sa, sb) = product.input_shapes(m, n, k);
                assert_eq!(product.dims(&sa, &sb), Ok((m, n, k)), "{product:?}");
                let (va, vb) = (data(m * k, 1 + m as u32), data(k * n, 7 + n as u32));
                // The logical matrices L (m × k) and R (k × n), row-major.
                let l: Vec<f32> = (0..m * k)
                    .map(|t| match product {
                        Product::Tn => va[(t % k) * m + t / k],
                        _ => va[t],
                    })
                    .collect();
                let r: Vec<f32> = (0..k * n)
                    .map(|t| match product {
                        Product::Nt => vb[(t % n) * k + t / n],
                        _ => vb[t],
                    })
                    .collect();
                let want: Vec<f32> = (0..m * n)
                    .map(|t| (0..k).fold(0.0f32, |acc, p| acc + l[t / n * k + p] * r[p * n + t % n]))
                    .collect();
                for (la, lb, lc) in (0..27).map(|x| (x % 3, x / 3 % 3, x / 9)) {
                    let (a, stra) = place(sa[0], sa[1], &va, la as u8);
                    let (b, strb) = place(sb[0], sb[1], &vb, lb as u8);
                    let (mut c, strc) = place(m, n, &vec![0.0; m * n], lc as u8);
                    let g = gemm_args(product, (m, n, k), stra, strb, strc)
                        .unwrap_or_else(|u| panic!("{product:?} {m}x{n}x{k} layouts {la}{lb}{lc}: {u:?}"));
                    let pick = |i: Input| if i == Input::First { &a } else { &b };
                    gemm(&g, pick(g.a), pick(g.b), &mut c)
                        .unwrap_or_else(|e| panic!("{product:?} {m}x{n}x{k} layouts {la}{lb}{lc}: {e}"));
                    let got: Vec<f32> = (0..m * n)
                        .map(|t| c[(t / n) * strc[0] as usize + (t % n) * strc[1] as usize])
                        .collect();
                    let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{product:?} {m}x{n}x{k} layouts {la}{lb}{lc}: {got:?} vs {want:?}");
                }
            }
        }
    }

    #[test]
    fn contiguous_operands_give_the_classic_arguments() {
        let contiguous = |s: [usize; 2]| [s[1] as isize, 1];
        for (product, want) in [
            (Product::Nn, (Trans::N, 5, Trans::N, 7)),
            (Product::Tn, (Trans::N, 5, Trans::T, 3)),
            (Product::Nt, (Trans::T, 7, Trans::N, 7)),
        ] {
            let (sa, sb) = product.input_shapes(3, 5, 7);
            let g = gemm_args(product, (3, 5, 7), contiguous(sa), contiguous(sb), [5, 1]).unwrap();
            assert_eq!((g.transa, g.lda, g.transb, g.ldb), want, "{product:?}");
            assert_eq!((g.m, g.n, g.k, g.ldc, g.a), (5, 3, 7, 5, Input::Second));
        }
    }

    #[test]
    fn layouts_cublas_cannot_read_are_named() {
        // Broadcast rows, a step in both strides, negative strides.
        assert_eq!(operand(3, 4, [0, 1]), None);
        assert_eq!(operand(3, 4, [8, 2]), None);
        assert_eq!(operand(3, 4, [-4, 1]), None);
        // Overlapping rows (ld below the row length).
        assert_eq!(operand(3, 4, [2, 1]), None);
        // Size-1 dimensions take any stride.
        assert_eq!(operand(1, 4, [0, 1]), Some((Trans::N, 1)));
        assert_eq!(operand(3, 1, [5, 77]), Some((Trans::T, 5)));
        assert_eq!(operand(3, 1, [1, 77]), Some((Trans::N, 3)));
        assert_eq!(operand(1, 1, [0, 0]), Some((Trans::N, 1)));
        let (nn, row) = (Product::Nn, [4, 1]);
        assert_eq!(gemm_args(nn, (3, 4, 4), [0, 1], row, row), Err(Unfit::A));
        assert_eq!(gemm_args(nn, (3, 4, 4), row, [4, 2], row), Err(Unfit::B));
        assert_eq!(gemm_args(nn, (3, 4, 4), row, row, [8, 2]), Err(Unfit::C));
    }

    #[test]
    fn dims_refuse_mismatched_shapes() {
        assert!(Product::Nn.dims(&[2, 3], &[2, 3]).is_err());
        assert!(Product::Tn.dims(&[2, 3], &[3, 2]).is_err());
        assert!(Product::Nt.dims(&[2, 3], &[3, 2]).is_err());
        assert!(Product::Nt.dims(&[2, 3, 1], &[3, 2]).is_err());
        assert_eq!(Product::Tn.dims(&[4, 2], &[4, 3]), Ok((2, 3, 4)));
        assert_eq!(Product::Nt.dims(&[2, 4], &[3, 4]), Ok((2, 3, 4)));
    }
}
