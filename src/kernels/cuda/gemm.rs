//! The arguments of the cuBLAS `sgemm` call behind `matmul`, `matmul_tn` and `matmul_nt`:
//! a pure function of the op and its sizes, so that the derivation is checked on the host.
//!
//! # Derivation
//!
//! cuBLAS is column-major: `sgemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc)` computes the
//! `M × N` matrix `C = op(A) op(B)`, where `op(X)` is `X` (`N`) or `Xᵀ` (`T`), `op(A)` is
//! `M × K`, `op(B)` is `K × N`, and element `(i, j)` of a column-major matrix with leading
//! dimension `ld` is at `i + j·ld`. The matrix actually stored is `K × M` for `ta = T`
//! (else `M × K`), and `N × K` for `tb = T` (else `K × N`); a leading dimension must be at
//! least the stored matrix's row count (and at least 1).
//!
//! Our tensors are row-major. A row-major `r × c` matrix `X` (element `(i, j)` at
//! `i·c + j`) is, read column-major with `ld = c`, the `c × r` matrix `Xᵀ`. So the row-major
//! output `C: [m, n]` is the column-major `n × m` matrix `Cᵀ` with `ldc = n`, and instead
//! of `C = P Q` we ask cuBLAS for `Cᵀ = Qᵀ Pᵀ`: cuBLAS's first operand is the op's second
//! input, cuBLAS's second operand the op's first, `M = n`, `N = m`, `K = k`.
//!
//! - `matmul`, `C = A B`, `A: [m, k]`, `B: [k, n]`. `Cᵀ = Bᵀ Aᵀ`. Stored `B` read
//!   column-major is `Bᵀ` (`n × k`, `ld = n`): flag `N`. Stored `A` is `Aᵀ` (`k × m`,
//!   `ld = k`): flag `N`.
//! - `matmul_tn`, `C = Aᵀ B`, `A: [k, m]`, `B: [k, n]`. `Cᵀ = Bᵀ A`. Stored `B` is `Bᵀ`
//!   (`n × k`, `ld = n`): flag `N`. Stored `A` read column-major is `Aᵀ` (`m × k`,
//!   `ld = m`), and we need `A` itself: flag `T`.
//! - `matmul_nt`, `C = A Bᵀ`, `A: [m, k]`, `B: [n, k]`. `Cᵀ = B Aᵀ`. Stored `B` read
//!   column-major is `Bᵀ` (`k × n`, `ld = k`), and we need `B`: flag `T`. Stored `A` is
//!   `Aᵀ` (`k × m`, `ld = k`): flag `N`.
//!
//! In every case `ldc = n`, and each leading dimension equals the stored matrix's row count
//! as cuBLAS requires (`n ≥ M`, `k ≥ K`, `m ≥ N` in the respective roles).

/// A transpose flag of a column-major BLAS call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trans {
    /// Use the stored matrix as it is (`CUBLAS_OP_N`).
    N,
    /// Use its transpose (`CUBLAS_OP_T`).
    T,
}

/// A matrix product op computed by `sgemm`.
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
}

/// The op's input a BLAS operand reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Input 0 (`a`).
    First,
    /// Input 1 (`b`).
    Second,
}

/// The arguments of one column-major `sgemm` (`alpha = 1`, `beta = 0`).
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

/// The `sgemm` arguments that compute `product` into a row-major `[m, n]` output with inner
/// size `k` (see the module docs for the derivation).
pub fn gemm_args(product: Product, m: usize, n: usize, k: usize) -> GemmArgs {
    let (transa, lda, transb, ldb) = match product {
        Product::Nn => (Trans::N, n, Trans::N, k),
        Product::Tn => (Trans::N, n, Trans::T, m),
        Product::Nt => (Trans::T, k, Trans::N, k),
    };
    GemmArgs { transa, transb, m: n, n: m, k, a: Input::Second, lda, b: Input::First, ldb, ldc: n }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, run, t_f32};
    use crate::kernels::{MatmulKernel, MatmulNtKernel, MatmulTnKernel};

    /// A reference column-major `sgemm` with `alpha = 1`, `beta = 0`, following the BLAS
    /// definition, with cuBLAS's argument checks; each element adds its products in
    /// increasing `p`, as the CPU kernels do.
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        ta: Trans,
        tb: Trans,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        ldc: usize,
    ) -> Result<Vec<f32>, String> {
        let rows_a = if ta == Trans::N { m } else { k };
        let rows_b = if tb == Trans::N { k } else { n };
        if lda < rows_a.max(1) || ldb < rows_b.max(1) || ldc < m.max(1) {
            return Err(format!("leading dimension too small: {lda} {ldb} {ldc}"));
        }
        let cols_a = if ta == Trans::N { k } else { m };
        let cols_b = if tb == Trans::N { n } else { k };
        if a.len() < lda * cols_a || b.len() < ldb * cols_b {
            return Err(format!("operands of {} and {} floats are too small", a.len(), b.len()));
        }
        let mut c = vec![f32::NAN; ldc * n];
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f32;
                for p in 0..k {
                    let x = if ta == Trans::N { a[i + p * lda] } else { a[p + i * lda] };
                    let y = if tb == Trans::N { b[p + j * ldb] } else { b[j + p * ldb] };
                    acc += x * y;
                }
                c[i + j * ldc] = acc;
            }
        }
        Ok(c)
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

    #[test]
    fn sgemm_arguments_compute_the_cpu_kernels_products() {
        for product in Product::ALL {
            let cpu: &'static dyn crate::vm::OpKernel = match product {
                Product::Nn => &MatmulKernel,
                Product::Tn => &MatmulTnKernel,
                Product::Nt => &MatmulNtKernel,
            };
            for (m, n, k) in [(3, 5, 7), (5, 3, 2), (1, 4, 3), (4, 1, 6), (2, 3, 1), (6, 6, 6), (1, 1, 9)] {
                let (sa, sb) = product.input_shapes(m, n, k);
                assert_eq!(product.dims(&sa, &sb), Ok((m, n, k)), "{product:?}");
                let (a, b) = (data(m * k, 1 + m as u32), data(k * n, 7 + n as u32));
                let want = run(cpu, 0.0, vec![t_f32(&sa, &a), t_f32(&sb, &b)], &[]).unwrap();
                let want = as_f32(&want[0]);
                let g = gemm_args(product, m, n, k);
                let pick = |i: Input| if i == Input::First { &a } else { &b };
                let got =
                    sgemm(g.transa, g.transb, (g.m, g.n, g.k), pick(g.a), g.lda, pick(g.b), g.ldb, g.ldc)
                        .unwrap_or_else(|e| panic!("{product:?} {m}x{n}x{k}: {e}"));
                // The column-major `g.m × g.n` result with `ldc = g.m` is the row-major
                // `[m, n]` output.
                assert_eq!((g.m * g.n, g.ldc, got.len()), (m * n, n, want.len()), "{product:?}");
                let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{product:?} {m}x{n}x{k}: {got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn dims_refuse_what_the_cpu_kernels_refuse() {
        assert!(Product::Nn.dims(&[2, 3], &[2, 3]).is_err());
        assert!(Product::Tn.dims(&[2, 3], &[3, 2]).is_err());
        assert!(Product::Nt.dims(&[2, 3], &[3, 2]).is_err());
        assert!(Product::Nt.dims(&[2, 3, 1], &[3, 2]).is_err());
        assert_eq!(Product::Tn.dims(&[4, 2], &[4, 3]), Ok((2, 3, 4)));
        assert_eq!(Product::Nt.dims(&[2, 4], &[3, 4]), Ok((2, 3, 4)));
    }
}
