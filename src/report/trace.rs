//! `CUDAPOOL_TRACE=path`: a Chrome trace-event JSON (Perfetto, chrome://tracing). Counter
//! tracks of allocated, reserved and limit bytes per device, sampled where the live stats are
//! published (slow paths, and every few hundred allocations of a thread); instant events for
//! OOMs, reclaims and limit changes. Memory is bounded: the newest [`MAX_EVENTS`] events are
//! kept and the number dropped is written too. Written at exit and on `cudapool_snapshot`.
//!
//! Uses: `log`, `sync`.

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
    /// (events oldest first, events dropped)
    events: Mutex<(VecDeque<Event>, u64)>,
}

impl Trace {
    pub fn new(path: PathBuf) -> Trace {
        Trace {
            path,
            start: Instant::now(),
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

    pub fn json(&self, pool: &str) -> String {
        let pid = std::process::id();
        let g = crate::base::sync::lock(&self.events);
        let mut o = format!(
            "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"cudapool\":\"{}\",\"pool\":\"{pool}\",\"dropped_events\":{}}},\"traceEvents\":[{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":\"cudapool pid {pid}\"}}}}",
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
        o.push_str("]}\n");
        o
    }

    pub fn write(&self, pool: &str) {
        if let Err(e) = crate::base::outfile::write(&self.path, self.json(pool).as_bytes()) {
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
        let j = t.json("split");
        assert!(j.contains("\"dropped_events\":11"), "oldest dropped");
        assert!(j.contains("\"name\":\"oom\",\"ph\":\"i\""));
        assert!(j.contains("\"name\":\"device 0 memory\",\"ph\":\"C\""));
        assert_eq!(j.matches("\"ph\":\"C\"").count(), MAX_EVENTS - 1);
    }
}
