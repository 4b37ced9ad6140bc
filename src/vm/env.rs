//! The `EAGERVM_*` environment variables: the list of every one the library reads, and the
//! strict reading of each, so that a value the library cannot use is an [`EnvError`] that
//! names the variable, the value and what is accepted, never a setting silently dropped.
//!
//! [`Config::try_from_env`](crate::Config::try_from_env) reads them all and fails on the
//! first bad one; [`Config::from_env`](crate::Config::from_env) reads them the same way but
//! logs a bad one (a `tracing` warning with the same error) and keeps that field's default.
//! `docs/tuning.md` ("Environment variables") lists each variable and its accepted values.

use std::ffi::OsString;

/// Every `EAGERVM_*` variable the library reads, in the order
/// [`Config::try_from_env`](crate::Config::try_from_env) checks them.
pub const VARS: &[&str] = &[
    "EAGERVM_SYNC",
    "EAGERVM_PROFILE",
    "EAGERVM_CHECK_DATA",
    "EAGERVM_MOCK_DEVICES",
    "EAGERVM_CUDA_DEVICES",
    "EAGERVM_BATCH",
    "EAGERVM_SPIN",
    "EAGERVM_YIELDS",
    "EAGERVM_EVENT_INTERVAL",
    "EAGERVM_HIGH_WATER",
    "EAGERVM_LOW_WATER",
    "EAGERVM_MAX_TENSOR_BYTES",
    "EAGERVM_FLIGHT_RECORDS",
    "EAGERVM_FLIGHT_ALL_STREAMS",
    "EAGERVM_WATCHDOG_TIMEOUT_MS",
    "EAGERVM_FLIGHT_DUMP",
    // `StreamPriorities::ENV`, spelt out: the configuration reads this file, not the reverse.
    "EAGERVM_STREAM_PRIORITIES",
    crate::ep::mock::ENV_DELAY_US,
    crate::ep::mock::ENV_JITTER_US,
    crate::alloc::pin::ENV_LOCK_MIN_BYTES,
    crate::ep::cuda::ENV_DRIVER_LIB,
    // `crate::ep::ccl::nccl::ENV_NCCL_LIB`, which exists only with the `cuda` feature.
    "EAGERVM_NCCL_LIB",
    // The CPU kernels' thread count, read a layer above this one.
    "EAGERVM_KERNEL_THREADS",
];

/// An `EAGERVM_*` variable set to a value the library cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {var}={value:?}: {why}; expected {accepted} (docs/tuning.md, \"Environment variables\")")]
pub struct EnvError {
    /// The variable.
    pub var: &'static str,
    /// Its value (lossily decoded where it is not UTF-8).
    pub value: String,
    /// What is wrong with it.
    pub why: String,
    /// What the variable accepts.
    pub accepted: &'static str,
}

impl From<EnvError> for crate::vm::Error {
    fn from(e: EnvError) -> Self {
        crate::vm::Error::Config(e.to_string())
    }
}

/// What a boolean variable accepts.
pub(crate) const BOOL: &str = "1, 0, true or false (any case; empty is the same as unset)";

/// Reads variables through a lookup (the process environment, or a test's map).
pub(crate) struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<OsString>,
}

impl<'a> Env<'a> {
    pub(crate) fn new(get: &'a dyn Fn(&str) -> Option<OsString>) -> Self {
        Env { get }
    }

    /// The variable's text, `None` where it is unset or empty; not UTF-8 is an error.
    pub(crate) fn text(&self, var: &'static str, accepted: &'static str) -> Result<Option<String>, EnvError> {
        let Some(raw) = (self.get)(var) else { return Ok(None) };
        match raw.into_string() {
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Ok(Some(s)),
            Err(raw) => Err(EnvError {
                var,
                value: raw.to_string_lossy().into_owned(),
                why: "not valid UTF-8".into(),
                accepted,
            }),
        }
    }

    /// A path: any non-empty value.
    pub(crate) fn path(&self, var: &'static str) -> Option<OsString> {
        (self.get)(var).filter(|v| !v.is_empty())
    }

    /// `1`/`true` or `0`/`false`.
    pub(crate) fn bool(&self, var: &'static str) -> Result<Option<bool>, EnvError> {
        let Some(v) = self.text(var, BOOL)? else { return Ok(None) };
        match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" => Ok(Some(true)),
            "0" | "false" => Ok(Some(false)),
            _ => Err(EnvError { var, value: v, why: "not a boolean".into(), accepted: BOOL }),
        }
    }

    /// A whole number of type `T` (surrounding whitespace ignored), at least `min`.
    pub(crate) fn int<T>(
        &self,
        var: &'static str,
        min: T,
        accepted: &'static str,
    ) -> Result<Option<T>, EnvError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display,
        T::Err: std::fmt::Display,
    {
        let Some(v) = self.text(var, accepted)? else { return Ok(None) };
        match v.trim().parse::<T>() {
            Ok(n) if n >= min => Ok(Some(n)),
            Ok(n) => Err(EnvError { var, value: v, why: format!("{n} is below {min}"), accepted }),
            Err(e) => Err(EnvError { var, value: v, why: e.to_string(), accepted }),
        }
    }
}
