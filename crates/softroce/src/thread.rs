//! Which thread is running: the device's engine thread, or an application
//! thread inside `DeviceOps::drive`. Completion handlers run only on such a
//! thread (ibverbs delivers completion events on the provider's context, not
//! inside the call that produced them), so a handler never runs under a
//! lock its caller holds.

use std::cell::Cell;

thread_local! {
    static IS_ENGINE: Cell<bool> = const { Cell::new(false) };
    /// Set while a thread is inside `DeviceOps::drive`.
    static DRIVING: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a device's engine thread (for its lifetime).
pub(crate) fn become_engine() {
    IS_ENGINE.with(|c| c.set(true));
}

/// Marks whether the calling thread is inside `DeviceOps::drive`.
pub(crate) fn set_driving(on: bool) {
    DRIVING.with(|c| c.set(on));
}

/// True on a device's engine thread.
pub(crate) fn on_engine_thread() -> bool {
    IS_ENGINE.with(|c| c.get())
}

/// True where completion handlers may run directly: the engine thread, or
/// a thread inside `DeviceOps::drive` (which the caller entered holding no
/// lock a handler takes).
pub(crate) fn runs_handlers() -> bool {
    on_engine_thread() || DRIVING.with(|c| c.get())
}
