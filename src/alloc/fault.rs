//! Deliberate allocation failures, for tests: which tensors' storage an allocator refuses
//! as if out of memory (`Config::fault`, `FaultInjection::fail_alloc_one_in`).
//!
//! The choice depends on the tensor's id and a seed alone, not on the order in which
//! threads allocate, so a test can tell in advance which instructions fail and compare the
//! VM with a sequential reference (`tests/integration/lifecycle.rs`, the soak).

/// Deliberate allocation failures, for tests (see the module docs): the storage of about
/// one tensor in `one_in` fails to allocate, the tensors chosen by a hash of the tensor's
/// id and `seed`; `one_in == 0` chooses none. A chosen tensor's every allocation fails, so
/// which instructions fail follows from the program alone, whatever the threads' timing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocFaults {
    /// About one tensor in this many cannot get storage (0: none).
    pub one_in: u64,
    /// Seeds the choice of tensors.
    pub seed: u64,
}

impl AllocFaults {
    /// Whether the storage of tensor `tensor` is made to fail.
    #[inline]
    pub fn fails(&self, tensor: u64) -> bool {
        self.one_in != 0 && mix64(self.seed ^ tensor.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % self.one_in == 0
    }
}

/// SplitMix64's finaliser: every bit of the result depends on every bit of `x`.
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
