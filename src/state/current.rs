//! The calling thread's context and its pool: the hot path's way in (the per-thread cache,
//! else the map, making the pool on first use), and running in a stream's context.

use super::clock::ContextClock;
use super::contexts::{ContextPool, Contexts};
use super::Shim;
use crate::base::cu::*;
use crate::pool::new_pool;
use crate::pool::ThreadCache;
use std::sync::Arc;

impl Shim {
    /// The pool of context `ctx` on `device`, made on first use.
    pub(crate) fn context_pool(&self, ctx: usize, device: CUdevice) -> Arc<ContextPool> {
        self.contexts.get_or_make(ctx, || {
            self.start_idle_thread();
            self.start_ready_thread();
            let clock = ContextClock::made(self.driver, ctx, self.config.reuse);
            ContextPool {
                device,
                pool: new_pool(
                    self.config.pool,
                    self.config.segments == crate::base::config::Segments::Expandable
                        && super::ipc::may_expand(),
                    self.config.stitch,
                    clock.clone(),
                ),
                clock,
            }
        })
    }

    /// Runs `f` with the calling thread's current context, its pool and the thread's own cache
    /// in it: from the per-thread cache when the thread knows its context (no driver call) or
    /// the driver names it, else from the map, creating the pool on first use. `f` must not
    /// re-enter the shim.
    pub(crate) fn with_current_pool<T>(
        &self,
        f: impl FnOnce(usize, &ContextPool, Option<&ThreadCache>) -> T,
    ) -> Result<T, CUresult> {
        let f = match Contexts::with_thread_cached(None, f) {
            Ok(r) => return Ok(r),
            Err(f) => f,
        };
        let ctx = self.current_context()?.ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let generation = Contexts::generation();
        let f = match Contexts::with_thread_cached(Some(ctx), f) {
            Ok(r) => return Ok(r),
            Err(f) => f,
        };
        let dev = self.driver.current_device()?;
        let cp = self.context_pool(ctx, dev);
        Contexts::remember_for_thread(ctx, generation, cp.clone());
        Ok(f(ctx, &cp, None))
    }

    /// The calling thread's current context: the one it is known to have set (see
    /// `Contexts::known_current`), else the driver's answer.
    fn current_context(&self) -> Result<Option<usize>, CUresult> {
        match Contexts::known_current() {
            Some(c) => Ok(Some(c)),
            None => Ok(self.driver.current_context()?.map(|c| c as usize)),
        }
    }

    /// Runs `f` with the pool of context `ctx`, if it has one, and the thread's own cache in
    /// it (from the per-thread cache when it is `ctx`'s). `f` must not re-enter the shim.
    pub(crate) fn with_pool_of<T>(
        &self,
        ctx: usize,
        f: impl FnOnce(&ContextPool, Option<&ThreadCache>) -> T,
    ) -> Option<T> {
        match Contexts::with_thread_cached(Some(ctx), |_, cp, mine| f(cp, mine)) {
            Ok(r) => Some(r),
            Err(f) => self.contexts.get(ctx).map(|cp| f(ctx, &cp, None)),
        }
    }

    /// Runs `f` with context `ctx` current on this thread (pushed and popped around it, if the
    /// driver lets it). Inside `f` the thread does not know its context (the driver is asked);
    /// after it, it knows what it knew before.
    pub fn in_context<T>(&self, ctx: usize, f: impl FnOnce() -> T) -> T {
        let before = Contexts::known_current();
        self.driver.in_context(ctx, || {
            Contexts::set_known_current(None);
            let r = f();
            Contexts::set_known_current(before);
            r
        })
    }

    /// Runs `f` with the context of `stream` current (it is, unless the program passed a
    /// stream of another context).
    pub fn in_stream_context<T>(&self, stream: usize, f: impl FnOnce() -> T) -> T {
        let s = stream;
        if s == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD {
            return f();
        }
        let current = self.current_context().ok().flatten();
        match self.driver.context_of_stream(s) {
            Some(ctx) if ctx != 0 && Some(ctx) != current => self.in_context(ctx, f),
            _ => f(),
        }
    }

    /// The calling thread's context and device, for a pass-through allocation on `stream`.
    pub fn stream_context(&self, stream: usize) -> Result<(usize, CUdevice), CUresult> {
        self.in_stream_context(stream, || self.current())
    }
}
