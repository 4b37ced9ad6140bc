//! Dependence objects.
#[derive(Debug, Default)]
pub(crate) struct DepObject;
