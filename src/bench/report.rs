//! What `sekali bench` reports: one JSON line and a table, and whether the run failed.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub provider: String,
    pub run_id: String,
    /// "ascending" or "random": the order of the ids (see [`super::EventTemplate::with_random_ids`]).
    pub ids: &'static str,
    pub concurrency: usize,
    /// The offered rate (`--rate`), requests per second; absent when every connection sends
    /// as soon as its previous answer arrives. When set, a request that went out late is timed
    /// from when it was due (see `Pacing` in `bench`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    pub sent: usize,
    pub unique: usize,
    pub ok_2xx: usize,
    pub non_2xx: BTreeMap<u16, usize>,
    pub errors: usize,
    /// With `--retry`: requests sent again after a 5xx. Only a delivery's final answer counts
    /// in `ok_2xx`, `non_2xx` or `errors`.
    pub retried: usize,
    pub seconds: f64,
    /// Requests answered 2xx per second: what the server durably accepted. A non-2xx answer or
    /// an error counts in `sent`, never here.
    pub deliveries_per_sec: f64,
    /// Latency percentiles of the requests answered 2xx, in milliseconds; `None` (JSON `null`)
    /// when none was. A fast refusal (a 503 from a full queue, a 401 from a wrong secret) would
    /// otherwise pull them down.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// The slowest deliveries answered 2xx (at most [`super::SLOWEST`]), slowest first, with when
    /// each was sent: whether a run's worst waits came at its start, together, or spread out.
    pub slowest: Vec<SlowDelivery>,
    /// What each instance's `/metrics` said of the run: its writer's commits and their latency,
    /// and its outboxes' backlog at the end.
    pub server_metrics: Vec<super::ServerMetrics>,
    /// This machine's CPU and bench's own over the load (Linux; absent elsewhere).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_cpu: Option<super::cpu::MachineCpu>,
    /// "ok" or what --check-db found wrong; absent without --check-db.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_db: Option<String>,
    /// What `--cleanup` removed, or why it failed; absent without it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<Cleanup>,
}

/// The outcome of `--cleanup`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cleanup {
    Done(super::CleanedUp),
    Failed(String),
}

/// A delivery answered 2xx: how long it took, and when it was sent, in seconds since the run
/// began (for a paced request sent late, when it was due).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SlowDelivery {
    pub ms: f64,
    pub sent_at_s: f64,
}

impl BenchReport {
    /// Why the run does not show the server accepting every delivery, if it does not: nothing
    /// sent, requests that failed or were answered other than 2xx (a wrong secret, a full
    /// queue), or what `--check-db` found. The command then exits non-zero.
    pub fn failure(&self) -> Option<String> {
        let refused: usize = self.non_2xx.values().sum();
        let mut why = Vec::new();
        if self.sent == 0 {
            why.push("no request was sent".to_owned());
        }
        if self.errors > 0 {
            why.push(format!(
                "{} of {} requests failed without an answer",
                self.errors, self.sent
            ));
        }
        if refused > 0 {
            why.push(format!(
                "{refused} of {} requests were answered other than 2xx",
                self.sent
            ));
        }
        if let Some(check) = self.check_db.as_deref().filter(|c| *c != "ok") {
            why.push(format!("--check-db: {check}"));
        }
        if let Some(Cleanup::Failed(reason)) = &self.cleanup {
            why.push(format!("--cleanup: {reason}"));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// The human-readable table printed after the JSON line.
    pub fn table(&self) -> String {
        let non_2xx = if self.non_2xx.is_empty() {
            "none".to_owned()
        } else {
            self.non_2xx
                .iter()
                .map(|(code, n)| format!("{code}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ms =
            |v: Option<f64>| v.map_or_else(|| "- (no 2xx)".to_owned(), |v| format!("{v:.2} ms"));
        let mut out = format!(
            "provider           {}\nids                {}\nconcurrency        {}\nsent               {}\nunique events      {}\n\
             2xx                {}\nnon-2xx            {}\nerrors             {}\nseconds            {:.2}\n\
             deliveries/s       {:.0} (answered 2xx)\n2xx latency p50    {}\n2xx latency p90    {}\n\
             2xx latency p99    {}\n2xx latency max    {}\n",
            self.provider,
            self.ids,
            self.concurrency,
            self.sent,
            self.unique,
            self.ok_2xx,
            non_2xx,
            self.errors,
            self.seconds,
            self.deliveries_per_sec,
            ms(self.p50_ms),
            ms(self.p90_ms),
            ms(self.p99_ms),
            ms(self.max_ms)
        );
        if !self.slowest.is_empty() {
            let slowest: Vec<String> = self
                .slowest
                .iter()
                .map(|d| format!("{:.2} ms at {:.1} s", d.ms, d.sent_at_s))
                .collect();
            out.push_str(&format!("slowest 2xx        {}\n", slowest.join(", ")));
        }
        for server in &self.server_metrics {
            out.push_str(&format!("server /metrics    {}\n", server.line()));
        }
        if let Some(cpu) = &self.machine_cpu {
            // The servers' CPU only when every instance reported it.
            let servers = self
                .server_metrics
                .iter()
                .map(|s| s.cpu_seconds)
                .sum::<Option<f64>>()
                .filter(|_| !self.server_metrics.is_empty());
            out.push_str(&format!(
                "cpu (this machine) {}\n",
                cpu.line(self.ok_2xx, servers)
            ));
        }
        if self.retried > 0 {
            out.push_str(&format!(
                "retried            {} (sent again after a 5xx, as a provider would)\n",
                self.retried
            ));
        }
        if let Some(rate) = self.rate {
            out.push_str(&format!(
                "offered rate       {rate:.0}/s (a request sent late is timed from when it was due)\n"
            ));
        }
        if let Some(check) = &self.check_db {
            out.push_str(&format!("check-db           {check}\n"));
        }
        match &self.cleanup {
            Some(Cleanup::Done(c)) => {
                out.push_str(&format!(
                    "cleanup            removed {} events, {} orders, {} transitions, {} payments, \
                     {} emails and {} files",
                    c.events, c.orders, c.transitions, c.payments, c.emails, c.files
                ));
                if c.waited_s > 0.0 {
                    out.push_str(&format!(
                        ", after waiting {:.1} s for the relay to finish the run's emails it held",
                        c.waited_s
                    ));
                }
                out.push('\n');
                if !c.files_kept.is_empty() {
                    out.push_str(&format!(
                        "cleanup kept       {} (named as the run's emails, but not provably \
                         theirs)\n",
                        c.files_kept.join(", ")
                    ));
                }
            }
            Some(Cleanup::Failed(reason)) => {
                out.push_str(&format!("cleanup            FAILED: {reason}\n"));
            }
            None => {}
        }
        out
    }
}
