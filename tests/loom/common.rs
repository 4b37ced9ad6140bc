//! What the loom models share: the exploration bound, and reading a failed model's message.

/// Explore `f` with a preemption bound that keeps each model to seconds: 3 by default, or
/// `LOOM_MAX_PREEMPTIONS` where it is set (5 takes about ten seconds per file).
pub fn check(f: impl Fn() + Sync + Send + 'static) {
    check_bounded(3, f);
}

/// [`check`] with another default bound, for a model of more threads, whose exploration
/// grows with the bound much faster (`LOOM_MAX_PREEMPTIONS` still sets it where set).
pub fn check_bounded(default: usize, f: impl Fn() + Sync + Send + 'static) {
    let bound = match std::env::var("LOOM_MAX_PREEMPTIONS") {
        Ok(v) => v.parse().expect("LOOM_MAX_PREEMPTIONS must be a whole number"),
        Err(_) => default,
    };
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(bound);
    builder.check(f);
}

/// Run `model` (a model with a planted bug), expect loom to fail it, and return the failure's
/// message.
pub fn failure_of(model: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let payload = std::panic::catch_unwind(model).expect_err("loom did not find the planted bug");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
