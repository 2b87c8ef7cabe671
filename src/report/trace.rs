//! `CUDAPOOL_TRACE=path`: a Chrome trace-event JSON (Perfetto, chrome://tracing). Counter
//! tracks of allocated, reserved and limit bytes per device, taken at every allocation and free
//! (cache hits included) and when the trace is written (at exit: what the program left);
//! instant events for OOMs, reclaims and limit changes. Memory is bounded: the newest
//! [`MAX_EVENTS`] events are kept and the number dropped is written too. Written at exit and on
//! `cudapool_snapshot`.
//! Under `CUDAPOOL_HISTORY` too, the history's allocations and frees are written as instant
//! events `alloc` and `free` (args `device`, `addr`, `bytes`): what `cudapool replay` reads.

use crate::state::history::{Action, Event as HistoryEvent};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

pub const MAX_EVENTS: usize = 200_000;

enum Event {
    Counter {
        ts_us: u64,
        device: i32,
        allocated: u64,
        reserved: u64,
        limit: u64,
    },
    Instant {
        ts_us: u64,
        device: i32,
        name: &'static str,
        bytes: u64,
    },
}

pub struct Trace {
    path: PathBuf,
    start: Instant,
    /// `start` in microseconds since the Unix epoch (the history's clock).
    start_epoch_us: u64,
    /// (events oldest first, events dropped)
    events: Mutex<(VecDeque<Event>, u64)>,
}

impl Trace {
    pub fn new(path: PathBuf) -> Trace {
        Trace {
            path,
            start: Instant::now(),
            start_epoch_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            events: Mutex::new((VecDeque::new(), 0)),
        }
    }

    fn push(&self, e: Event) {
        let mut g = crate::base::sync::lock(&self.events);
        if g.0.len() == MAX_EVENTS {
            g.0.pop_front();
            g.1 += 1;
        }
        g.0.push_back(e);
    }

    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn counter(&self, device: i32, allocated: u64, reserved: u64, limit: u64) {
        let ts_us = self.now_us();
        self.push(Event::Counter {
            ts_us,
            device,
            allocated,
            reserved,
            limit,
        });
    }

    /// `name`: "oom" (bytes asked), "reclaim" (bytes released) or "limit" (the new limit).
    pub fn instant(&self, device: i32, name: &'static str, bytes: u64) {
        let ts_us = self.now_us();
        self.push(Event::Instant {
            ts_us,
            device,
            name,
            bytes,
        });
    }

    /// The trace as JSON; `about`: more members of `otherData`, each after a comma (the
    /// program, the GPUs); `allocations`: each device's history (`alloc` and `free` events are
    /// written, in order, after the counters).
    pub fn json(
        &self,
        pool: &str,
        about: &str,
        allocations: &[(i32, Vec<HistoryEvent>)],
    ) -> String {
        let pid = std::process::id();
        let g = crate::base::sync::lock(&self.events);
        let mut o = format!(
            "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"cudapool\":\"{}\",\"pool\":\"{pool}\",\"dropped_events\":{}{about}}},\"traceEvents\":[{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":\"cudapool pid {pid}\"}}}}",
            env!("CARGO_PKG_VERSION"),
            g.1
        );
        for e in &g.0 {
            match *e {
                Event::Counter {
                    ts_us,
                    device,
                    allocated,
                    reserved,
                    limit,
                } => {
                    let _ = write!(
                        o,
                        ",{{\"name\":\"device {device} memory\",\"ph\":\"C\",\"ts\":{ts_us},\"pid\":{pid},\"tid\":0,\"args\":{{\"allocated\":{allocated},\"reserved\":{reserved},\"limit\":{limit}}}}}"
                    );
                }
                Event::Instant {
                    ts_us,
                    device,
                    name,
                    bytes,
                } => {
                    let _ = write!(
                        o,
                        ",{{\"name\":\"{name}\",\"ph\":\"i\",\"s\":\"p\",\"ts\":{ts_us},\"pid\":{pid},\"tid\":0,\"args\":{{\"device\":{device},\"bytes\":{bytes}}}}}"
                    );
                }
            }
        }
        for (device, events) in allocations {
            for e in events {
                let name = match e.action {
                    Action::Alloc => "alloc",
                    Action::FreeRequested => "free",
                    _ => continue,
                };
                let ts_us = e.time_us.saturating_sub(self.start_epoch_us);
                let _ = write!(
                    o,
                    ",{{\"name\":\"{name}\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts_us},\"pid\":{pid},\"tid\":{},\"args\":{{\"device\":{device},\"addr\":{},\"bytes\":{}}}}}",
                    e.stream, e.addr, e.size
                );
            }
        }
        o.push_str("]}\n");
        o
    }

    pub fn write(&self, pool: &str, about: &str, allocations: &[(i32, Vec<HistoryEvent>)]) {
        let json = self.json(pool, about, allocations);
        if let Err(e) = crate::base::outfile::write(&self.path, json.as_bytes()) {
            crate::base::log::line(&format!("cannot write the trace: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_well_formed() {
        let t = Trace::new("/dev/null".into());
        for i in 0..(MAX_EVENTS as u64 + 10) {
            t.counter(0, i, i * 2, 0);
        }
        t.instant(1, "oom", 42);
        let free = HistoryEvent {
            action: Action::FreeRequested,
            addr: 0x1000,
            size: 512,
            stream: 0,
            time_us: t.start_epoch_us + 5,
            frames: None,
        };
        let j = t.json("split", ",\"program\":\"x\"", &[(0, vec![free])]);
        assert!(j.contains("\"name\":\"free\",\"ph\":\"i\",\"s\":\"t\",\"ts\":5,"));
        assert!(j.contains("\"args\":{\"device\":0,\"addr\":4096,\"bytes\":512}"));
        assert!(
            j.contains("\"dropped_events\":11,\"program\":\"x\"}"),
            "oldest dropped"
        );
        assert!(j.contains("\"name\":\"oom\",\"ph\":\"i\""));
        assert!(j.contains("\"name\":\"device 0 memory\",\"ph\":\"C\""));
        assert_eq!(j.matches("\"ph\":\"C\"").count(), MAX_EVENTS - 1);
    }
}
