//! CPU time over the load, read from `/proc` (Linux) just before the first request and just after
//! the last answer, so `--check-db`'s reads afterwards are not in it: this machine's, all cores,
//! busy and idle, and the load generator's own. With the servers and their database on this
//! machine (a benchmark's setup), what the machine was busy with beyond the servers' own CPU
//! (each one's `process_cpu_seconds_total`, in its `/metrics`) and bench's is the database's, and
//! whatever else ran: a run's CPU budget per delivery, which says what limits it once the cores
//! are full.

use serde::Serialize;

/// The machine's and bench's CPU over the load.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MachineCpu {
    /// Cores this machine has (online).
    pub cores: usize,
    /// CPU seconds the cores spent busy (user, system, interrupts), and idle (waiting for the
    /// disk included), summed over the cores.
    pub busy_seconds: f64,
    pub idle_seconds: f64,
    /// CPU seconds bench itself used (its client threads: signing, HTTP).
    pub bench_seconds: f64,
}

/// One reading of the counters [`MachineCpu`] is the difference of.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    cores: usize,
    busy: f64,
    idle: f64,
    own: f64,
}

impl CpuSample {
    /// Now; `None` where `/proc` cannot be read (another system), and the report then has no
    /// CPU figures.
    #[cfg(target_os = "linux")]
    pub fn take() -> Option<CpuSample> {
        use procfs::{CurrentSI, KernelStats};
        let stats = KernelStats::current().ok()?;
        let own = procfs::process::Process::myself().ok()?.stat().ok()?;
        let ticks = procfs::ticks_per_second() as f64;
        let t = &stats.total;
        let opt = |v: Option<u64>| v.unwrap_or(0);
        let busy = t.user + t.nice + t.system + opt(t.irq) + opt(t.softirq) + opt(t.steal);
        Some(CpuSample {
            cores: stats.cpu_time.len(),
            busy: busy as f64 / ticks,
            idle: (t.idle + opt(t.iowait)) as f64 / ticks,
            own: (own.utime + own.stime) as f64 / ticks,
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn take() -> Option<CpuSample> {
        None
    }

    /// What was spent from `earlier` to this reading.
    pub fn since(&self, earlier: &CpuSample) -> MachineCpu {
        MachineCpu {
            cores: self.cores,
            busy_seconds: self.busy - earlier.busy,
            idle_seconds: self.idle - earlier.idle,
            bench_seconds: self.own - earlier.own,
        }
    }
}

impl MachineCpu {
    /// The report's line: how busy the machine was, and CPU per delivery answered 2xx, split
    /// between the servers (`servers_seconds`, from their `/metrics`; `None` when an instance
    /// did not report it), bench and the rest.
    pub fn line(&self, deliveries: usize, servers_seconds: Option<f64>) -> String {
        let total = self.busy_seconds + self.idle_seconds;
        let busy = if total > 0.0 {
            100.0 * self.busy_seconds / total
        } else {
            0.0
        };
        let mut line = format!("{} cores {busy:.0} % busy", self.cores);
        if deliveries > 0 {
            let us = |s: f64| s * 1e6 / deliveries as f64;
            line.push_str(&format!("; per 2xx {:.0} us of CPU", us(self.busy_seconds)));
            match servers_seconds {
                Some(servers) => line.push_str(&format!(
                    ": servers {:.0}, bench {:.0}, the rest (the database, when it runs here) {:.0}",
                    us(servers),
                    us(self.bench_seconds),
                    us(self.busy_seconds - servers - self.bench_seconds)
                )),
                None => line.push_str(&format!(", bench {:.0}", us(self.bench_seconds))),
            }
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_cpu_per_delivery_is_split_between_the_servers_bench_and_the_rest() {
        let before = CpuSample {
            cores: 2,
            busy: 100.0,
            idle: 50.0,
            own: 1.0,
        };
        let after = CpuSample {
            cores: 2,
            busy: 109.0,
            idle: 51.0,
            own: 1.5,
        };
        let cpu = after.since(&before);
        assert_eq!(
            (cpu.busy_seconds, cpu.idle_seconds, cpu.bench_seconds),
            (9.0, 1.0, 0.5)
        );
        assert_eq!(
            cpu.line(30_000, Some(3.0)),
            "2 cores 90 % busy; per 2xx 300 us of CPU: servers 100, bench 17, the rest (the \
             database, when it runs here) 183"
        );
        assert_eq!(
            cpu.line(30_000, None),
            "2 cores 90 % busy; per 2xx 300 us of CPU, bench 17"
        );
        assert_eq!(cpu.line(0, Some(3.0)), "2 cores 90 % busy");
    }
}
