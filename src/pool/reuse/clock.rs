//! What reuse safety asks the device (the module's notes): the rule in force, and the fences a
//! [`Clock`] issues and answers for.

/// A fence handle from a [`Clock`].
pub type FenceId = u64;

/// When a freed block may be handed out again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReuseRule {
    /// At once, always (`CUDAPOOL_REUSE=immediate`).
    Immediate,
    /// At once: all device work of the context so far went to one queue (see the module doc).
    OneQueue,
    /// After a fence; a stream-ordered free at once for allocations on its stream.
    Fenced,
}

/// The device-side clock of one context: what reuse safety asks the driver.
pub trait Clock: Send + Sync {
    /// The rule now. Cheap: asked on every allocation and free.
    fn rule(&self) -> ReuseRule;
    /// A fence after all device work issued so far that may touch memory freed so far; `None`
    /// when none can be issued now (a graph capture is under way): blocks then stay pending.
    fn issue(&self) -> Option<FenceId>;
    /// Whether the work before `f` has completed. Never waits.
    fn is_done(&self, f: FenceId) -> bool;
    /// Waits until the work before `f` has completed; false when it cannot wait now (a graph
    /// capture is under way: a host wait is forbidden), and then nothing behind `f` may be
    /// taken back on the strength of this call.
    fn wait(&self, f: FenceId) -> bool;
    /// `f` will not be asked about again.
    fn retire(&self, f: FenceId);
    /// *Hands `f` over*: makes all device work issued from now on, on every queue of the
    /// context (new ones included), wait on the device for the work before `f`, without the
    /// host waiting. True when done: the blocks behind `f` may be handed out at once, and `f`
    /// is the clock's to drop (it is not retired). False when it cannot (a graph capture is
    /// under way, the queues cannot be trusted, or this clock never does): the pool waits.
    fn hand_over(&self, f: FenceId) -> bool {
        let _ = f;
        false
    }
    /// The pool missed (it is about to ask the driver): a chance for the clock's own
    /// housekeeping (retiring queues whose work has completed, at once). Never waits for the
    /// device.
    fn tick(&self) {}
}

/// A clock for `immediate` reuse: never fences.
pub struct ImmediateClock;

impl Clock for ImmediateClock {
    fn rule(&self) -> ReuseRule {
        ReuseRule::Immediate
    }
    fn issue(&self) -> Option<FenceId> {
        None
    }
    fn is_done(&self, _f: FenceId) -> bool {
        true
    }
    fn wait(&self, _f: FenceId) -> bool {
        true
    }
    fn retire(&self, _f: FenceId) {}
}
