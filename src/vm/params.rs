//! The parameter lists of op calls: the integers and scalars an op takes besides its one
//! scalar and flags (`sum`'s dims, `conv2d`'s stride, padding, dilation and groups,
//! `clamp`'s bounds), interned so that [`Attrs`](super::Attrs) carries a list as a 4-byte
//! number and stays `Copy` and 16 bytes.
//!
//! A list is [`Params`]: integers and scalars by position, whose meaning each op documents
//! (`docs/ops.md`). Equal lists get equal numbers for the life of the process (number 0 is
//! the empty list), so the builder's inference cache compares lists by number, and a
//! kernel reads its list by number without a lock (`Attrs::params`).
//!
//! The table is process-wide and append-only: a list, once numbered, stays until the
//! process exits. A program makes a handful of distinct lists (one per distinct call site
//! and shape), so it holds a few kilobytes; [`MAX_PARAMS`] bounds it for a program whose
//! lists never repeat (a pad width that grows every step), beyond which a new list is
//! refused ([`ParamsFull`]) rather than kept.
//!
//! Numbering takes a lock; reading does not. Each thread keeps a small direct-mapped cache
//! of the numbers it got, so an eager program that calls `x.sum(dim=1)` every step takes
//! the lock once. Entries are published in chunks of doubling size, each a `OnceLock`, and a
//! number is handed out only after its entry is set, so a reader of a number someone was
//! given always finds its list.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::OnceLock;

use fnv::FnvHasher;
use parking_lot::Mutex;
use smallvec::SmallVec;

use super::dtype::Scalar;

/// The most distinct lists the process numbers (number 0, the empty list, included).
pub const MAX_PARAMS: usize = 1 << 20;

/// Chunk `c` holds numbers `2^c .. 2^(c+1)` (chunk 0: numbers 0 and 1).
const CHUNKS: usize = MAX_PARAMS.trailing_zeros() as usize;

/// Slots of each thread's cache.
const SLOTS: usize = 32;

/// An op call's parameter list: integers and scalars, by position.
///
/// ```
/// use eagervm::prelude::*;
/// use eagervm::framework::Scalar;
///
/// // `x.sum(dim=(0, 2), keepdim=True)`: the dims, then keepdim.
/// let attrs = Attrs::default().with_params(&[0, 2, 1], &[])?;
/// assert_eq!(attrs.params().ints(), &[0, 2, 1]);
/// assert_eq!(attrs, Attrs::default().with_params(&[0, 2, 1], &[])?); // interned
/// // `x.clamp(min=-1, max=0.5)`: two scalars.
/// let clamp = Attrs::default().with_params(&[], &[Scalar::Int(-1), Scalar::Float(0.5)])?;
/// assert_eq!(clamp.params().scalars(), &[Scalar::Int(-1), Scalar::Float(0.5)]);
/// assert!(Attrs::default().params().is_empty());
/// # Ok::<(), eagervm::framework::ParamsFull>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Params {
    ints: SmallVec<[i64; 8]>,
    scalars: SmallVec<[Scalar; 2]>,
}

impl Params {
    /// A list of these integers and scalars.
    pub fn new(ints: &[i64], scalars: &[Scalar]) -> Params {
        Params { ints: ints.into(), scalars: scalars.into() }
    }

    /// The integers.
    #[inline]
    pub fn ints(&self) -> &[i64] {
        &self.ints
    }

    /// The scalars.
    #[inline]
    pub fn scalars(&self) -> &[Scalar] {
        &self.scalars
    }

    /// Whether the list has neither integers nor scalars.
    pub fn is_empty(&self) -> bool {
        self.ints.is_empty() && self.scalars.is_empty()
    }

    /// Integer `i`, or `default` when the list has fewer.
    #[inline]
    pub fn int_or(&self, i: usize, default: i64) -> i64 {
        self.ints.get(i).copied().unwrap_or(default)
    }

    /// Scalar `i`, if the list has it.
    #[inline]
    pub fn scalar(&self, i: usize) -> Option<Scalar> {
        self.scalars.get(i).copied()
    }

    /// The list numbered `id`: the empty list for 0 and for a number never handed out.
    #[inline]
    pub(crate) fn get(id: u32) -> &'static Params {
        static EMPTY: Params = Params { ints: SmallVec::new_const(), scalars: SmallVec::new_const() };
        if id == 0 {
            return &EMPTY;
        }
        let (c, at) = place(id);
        TABLE.chunks[c].get().and_then(|chunk| chunk[at].get()).copied().unwrap_or(&EMPTY)
    }

    /// The number of `self`: the same for equal lists, 0 for the empty one.
    pub(crate) fn intern(&self) -> Result<u32, ParamsFull> {
        if self.is_empty() {
            return Ok(0);
        }
        let slot = (hash_of(self) as usize) % SLOTS;
        let cached = CACHE.with(|c| {
            let c = c.borrow();
            c[slot].filter(|&id| Params::get(id) == self)
        });
        if let Some(id) = cached {
            return Ok(id);
        }
        let id = TABLE.intern(self)?;
        CACHE.with(|c| c.borrow_mut()[slot] = Some(id));
        Ok(id)
    }
}

/// Scalars compare and hash by kind and bits (so NaN equals itself and `-0.0` is not
/// `0.0`: two lists are equal exactly when a kernel cannot tell them apart).
fn scalar_key(s: &Scalar) -> (u8, u64) {
    match *s {
        Scalar::Float(f) => (0, f.to_bits()),
        Scalar::Int(i) => (1, i as u64),
        Scalar::Bool(b) => (2, u64::from(b)),
    }
}

impl PartialEq for Params {
    fn eq(&self, other: &Params) -> bool {
        self.ints == other.ints
            && self.scalars.len() == other.scalars.len()
            && self.scalars.iter().zip(&other.scalars).all(|(a, b)| scalar_key(a) == scalar_key(b))
    }
}

impl Eq for Params {}

impl Hash for Params {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.ints.hash(h);
        for s in &self.scalars {
            scalar_key(s).hash(h);
        }
    }
}

impl fmt::Display for Params {
    /// As the trace writes it: `ints=0,2,1 scalars=-1,0.5` (each part only when not empty).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if !self.ints.is_empty() {
            f.write_str("ints=")?;
            for (i, v) in self.ints.iter().enumerate() {
                write!(f, "{}{v}", if i == 0 { "" } else { "," })?;
            }
            sep = " ";
        }
        if !self.scalars.is_empty() {
            write!(f, "{sep}scalars=")?;
            for (i, s) in self.scalars.iter().enumerate() {
                f.write_str(if i == 0 { "" } else { "," })?;
                write_scalar(f, s)?;
            }
        }
        Ok(())
    }
}

/// A scalar as the trace writes it, so that reading it back gives the same kind and bits:
/// a float in Rust's shortest round-trip form, always with a `.`, an exponent, `NaN` or
/// `inf` (`1.0`, not `1`); an integer as it is; `true` or `false`.
pub(crate) fn write_scalar(f: &mut impl fmt::Write, s: &Scalar) -> fmt::Result {
    match *s {
        Scalar::Float(v) => write!(f, "{v:?}"),
        Scalar::Int(v) => write!(f, "{v}"),
        Scalar::Bool(b) => write!(f, "{b}"),
    }
}

/// Read a scalar [`write_scalar`] wrote: `true`/`false`, an integer, or a float.
pub(crate) fn parse_scalar(s: &str) -> Option<Scalar> {
    match s {
        "true" => Some(Scalar::Bool(true)),
        "false" => Some(Scalar::Bool(false)),
        _ => s.parse::<i64>().map(Scalar::Int).ok().or_else(|| s.parse::<f64>().ok().map(Scalar::Float)),
    }
}

/// A new parameter list was refused: the process already numbers [`MAX_PARAMS`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the process already holds {MAX_PARAMS} distinct op parameter lists (dims, sizes, bounds); a \
     program whose parameters never repeat should pass changing values as tensors"
)]
pub struct ParamsFull;

fn hash_of(p: &Params) -> u64 {
    let mut h = FnvHasher::default();
    p.hash(&mut h);
    h.finish()
}

/// The chunk and the place in it of number `id` (> 0).
#[inline]
fn place(id: u32) -> (usize, usize) {
    let c = (31 - id.leading_zeros()) as usize; // 2^c <= id < 2^(c+1)
    (c, id as usize - (1 << c))
}

/// The process's table.
struct Table {
    /// Chunk `c` has `2^c` entries (numbers `2^c ..`); set once, entries set once.
    chunks: [OnceLock<Box<[OnceLock<&'static Params>]>>; CHUNKS],
    /// The numbers given, and the next one (made on first use).
    numbers: OnceLock<Mutex<Numbers>>,
}

/// The numbers given, by list, and the next number.
type Numbers = (HashMap<&'static Params, u32, BuildHasherDefault<FnvHasher>>, u32);

static TABLE: Table = Table { chunks: [const { OnceLock::new() }; CHUNKS], numbers: OnceLock::new() };

thread_local! {
    static CACHE: RefCell<[Option<u32>; SLOTS]> = const { RefCell::new([None; SLOTS]) };
}

impl Table {
    fn intern(&self, p: &Params) -> Result<u32, ParamsFull> {
        let mut numbers = self.numbers.get_or_init(|| Mutex::new((HashMap::default(), 1))).lock();
        let (map, next) = &mut *numbers;
        if let Some(&id) = map.get(p) {
            return Ok(id);
        }
        if *next as usize >= MAX_PARAMS {
            return Err(ParamsFull);
        }
        let id = *next;
        let kept: &'static Params = Box::leak(Box::new(p.clone()));
        let (c, at) = place(id);
        let chunk = self.chunks[c].get_or_init(|| (0..1usize << c).map(|_| OnceLock::new()).collect());
        // Set before the number is handed out (the lock orders it before any use of `id`).
        let _ = chunk[at].set(kept);
        map.insert(kept, id);
        *next += 1;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_lists_get_one_number_and_read_back() {
        let a = Params::new(&[1, -2, 3], &[Scalar::Float(0.5)]);
        let id = a.intern().unwrap();
        assert_ne!(id, 0);
        assert_eq!(Params::new(&[1, -2, 3], &[Scalar::Float(0.5)]).intern(), Ok(id));
        assert_eq!(Params::get(id), &a);
        // Kind and bits matter: 1 is not 1.0, -0.0 is not 0.0, NaN is itself.
        let one_int = Params::new(&[], &[Scalar::Int(1)]).intern().unwrap();
        let one_float = Params::new(&[], &[Scalar::Float(1.0)]).intern().unwrap();
        assert_ne!(one_int, one_float);
        let z = Params::new(&[], &[Scalar::Float(0.0)]).intern().unwrap();
        let nz = Params::new(&[], &[Scalar::Float(-0.0)]).intern().unwrap();
        assert_ne!(z, nz);
        let nan = Params::new(&[], &[Scalar::Float(f64::NAN)]);
        assert_eq!(nan.intern(), nan.intern());
        assert_eq!(Params::default().intern(), Ok(0));
        assert!(Params::get(0).is_empty());
    }

    #[test]
    fn numbers_from_other_threads_read_back_and_agree() {
        let lists: Vec<Params> = (0..200).map(|i| Params::new(&[i, 7_000_000], &[])).collect();
        let ids: Vec<Vec<u32>> = std::thread::scope(|s| {
            let hs: Vec<_> =
                (0..2).map(|_| s.spawn(|| lists.iter().map(|p| p.intern().unwrap()).collect())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(ids[0], ids[1]);
        for (p, &id) in lists.iter().zip(&ids[0]) {
            assert_eq!(Params::get(id), p);
        }
    }

    #[test]
    fn places_cover_every_number_once() {
        assert_eq!(place(1), (0, 0));
        assert_eq!(place(2), (1, 0));
        assert_eq!(place(3), (1, 1));
        assert_eq!(place(4), (2, 0));
        assert_eq!(place(MAX_PARAMS as u32 - 1), (CHUNKS - 1, (1 << (CHUNKS - 1)) - 1));
    }

    #[test]
    fn written_lists_read_back() {
        let p = Params::new(
            &[0, -3],
            &[Scalar::Float(1.0), Scalar::Int(-4), Scalar::Bool(true), Scalar::Float(f64::NEG_INFINITY)],
        );
        assert_eq!(p.to_string(), "ints=0,-3 scalars=1.0,-4,true,-inf");
        let back: Vec<Scalar> = "1.0,-4,true,-inf".split(',').map(|s| parse_scalar(s).unwrap()).collect();
        assert_eq!(Params::new(&[0, -3], &back), p);
        assert_eq!(parse_scalar("NaN").map(|s| s.as_f64().is_nan()), Some(true));
        assert_eq!(parse_scalar("1e300"), Some(Scalar::Float(1e300)));
        assert_eq!(parse_scalar("x"), None);
    }
}
