//! What the server itself said about a run, read from its `/metrics` before and after the load:
//! the writer's commits and their latency, its batch sizes, and the outboxes' backlog at the end.
//! The same numbers an operator's Prometheus sees, not a side channel.

use serde::Serialize;

/// One scrape: every sample line, `name{labels}` and value.
#[derive(Debug, Default)]
pub struct Scrape(Vec<(String, f64)>);

impl Scrape {
    /// The Prometheus text format's sample lines (comments and blank lines skipped).
    pub fn parse(text: &str) -> Scrape {
        Scrape(
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .filter_map(|line| {
                    let (series, value) = line.rsplit_once(' ')?;
                    Some((series.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// The value of the series written exactly as `series` (`name` or `name{label="v"}`).
    fn get(&self, series: &str) -> f64 {
        self.find(series).unwrap_or(0.0)
    }

    /// The same, or `None` when the scrape has no such series.
    fn find(&self, series: &str) -> Option<f64> {
        self.0.iter().find(|(s, _)| s == series).map(|(_, v)| *v)
    }

    /// A histogram's buckets: each `le` bound with its cumulative count.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{le=\"");
        self.0
            .iter()
            .filter_map(|(series, count)| {
                let bound = series.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().ok()?
                };
                Some((bound, *count))
            })
            .collect()
    }
}

/// One instance's view of the run.
#[derive(Debug, Clone, Serialize)]
pub struct ServerMetrics {
    /// `host:port` of the instance.
    pub instance: String,
    /// Write transactions committed during the run.
    pub commits: u64,
    /// Their mean latency, and the bucket bound under which 99 % of them fell.
    pub commit_mean_ms: Option<f64>,
    pub commit_p99_ms_at_most: Option<f64>,
    /// Units of work (deliveries, relay claims and results) per commit, on average.
    pub batch_units_mean: Option<f64>,
    /// The outboxes' backlog when the load ended.
    pub email_pending_at_end: u64,
    pub email_oldest_due_s_at_end: f64,
    pub forward_pending_at_end: u64,
    pub forward_oldest_due_s_at_end: f64,
    /// The CPU seconds the instance's process used during the run (its
    /// `process_cpu_seconds_total`); `None` when its `/metrics` has none (not Linux, or an
    /// older sekali).
    pub cpu_seconds: Option<f64>,
}

impl ServerMetrics {
    /// The run between the scrapes `before` and `after` of `instance`.
    pub fn between(instance: String, before: &Scrape, after: &Scrape) -> ServerMetrics {
        const COMMIT: &str = "sekali_writer_commit_duration_seconds";
        const UNITS: &str = "sekali_writer_batch_units";
        const CPU: &str = "process_cpu_seconds_total";
        let delta = |series: &str| after.get(series) - before.get(series);
        let commits = delta(&format!("{COMMIT}_count"));
        let mean = |sum: f64| (commits > 0.0).then(|| sum / commits);
        let before_buckets = before.buckets(COMMIT);
        let p99 = (commits > 0.0)
            .then(|| {
                after.buckets(COMMIT).into_iter().find(|(bound, count)| {
                    let earlier = before_buckets
                        .iter()
                        .find(|(b, _)| b == bound)
                        .map_or(0.0, |(_, c)| *c);
                    count - earlier >= 0.99 * commits
                })
            })
            .flatten()
            .map(|(bound, _)| bound * 1000.0);
        ServerMetrics {
            instance,
            commits: commits as u64,
            commit_mean_ms: mean(delta(&format!("{COMMIT}_sum"))).map(|s| s * 1000.0),
            commit_p99_ms_at_most: p99,
            batch_units_mean: mean(delta(&format!("{UNITS}_sum"))),
            email_pending_at_end: after.get("sekali_outbox_pending{outbox=\"email\"}") as u64,
            email_oldest_due_s_at_end: after
                .get("sekali_outbox_oldest_due_age_seconds{outbox=\"email\"}"),
            forward_pending_at_end: after.get("sekali_outbox_pending{outbox=\"forward\"}") as u64,
            forward_oldest_due_s_at_end: after
                .get("sekali_outbox_oldest_due_age_seconds{outbox=\"forward\"}"),
            cpu_seconds: before
                .find(CPU)
                .zip(after.find(CPU))
                .map(|(before, after)| after - before),
        }
    }

    /// One line of the report's table.
    pub fn line(&self) -> String {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2} ms"));
        format!(
            "{}: {} commits, mean {}, p99 <= {}, {} units a commit; at the end {} emails pending \
             (oldest due {:.0} s), {} forwards pending (oldest due {:.0} s){}",
            self.instance,
            self.commits,
            ms(self.commit_mean_ms),
            ms(self.commit_p99_ms_at_most),
            self.batch_units_mean
                .map_or_else(|| "-".to_owned(), |u| format!("{u:.1}")),
            self.email_pending_at_end,
            self.email_oldest_due_s_at_end,
            self.forward_pending_at_end,
            self.forward_oldest_due_s_at_end,
            self.cpu_seconds
                .map_or_else(String::new, |s| format!(", {s:.2} s of CPU")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# HELP x\n\
        sekali_writer_commit_duration_seconds_bucket{le=\"0.001\"} 10\n\
        sekali_writer_commit_duration_seconds_bucket{le=\"0.01\"} 10\n\
        sekali_writer_commit_duration_seconds_bucket{le=\"+Inf\"} 10\n\
        sekali_writer_commit_duration_seconds_sum 0.005\n\
        sekali_writer_commit_duration_seconds_count 10\n\
        sekali_writer_batch_units_sum 10.0\n\
        sekali_writer_batch_units_count 10\n\
        process_cpu_seconds_total 1.25\n";

    #[test]
    fn the_runs_commits_are_the_difference_of_two_scrapes() {
        let after = "sekali_writer_commit_duration_seconds_bucket{le=\"0.001\"} 60\n\
            sekali_writer_commit_duration_seconds_bucket{le=\"0.01\"} 109\n\
            sekali_writer_commit_duration_seconds_bucket{le=\"+Inf\"} 110\n\
            sekali_writer_commit_duration_seconds_sum 0.305\n\
            sekali_writer_commit_duration_seconds_count 110\n\
            sekali_writer_batch_units_sum 1010.0\n\
            sekali_writer_batch_units_count 110\n\
            sekali_outbox_pending{outbox=\"email\"} 7\n\
            sekali_outbox_oldest_due_age_seconds{outbox=\"email\"} 1.5\n\
            process_cpu_seconds_total 4.5\n";
        let run = ServerMetrics::between(
            "127.0.0.1:8080".into(),
            &Scrape::parse(BEFORE),
            &Scrape::parse(after),
        );
        assert_eq!(run.commits, 100);
        assert!((run.commit_mean_ms.unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(
            run.commit_p99_ms_at_most,
            Some(10.0),
            "99 of 100 under 10 ms"
        );
        assert!((run.batch_units_mean.unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(run.email_pending_at_end, 7);
        assert_eq!(run.email_oldest_due_s_at_end, 1.5);
        assert_eq!(run.cpu_seconds, Some(3.25));
        assert!(run.line().ends_with(", 3.25 s of CPU"), "{}", run.line());
        let older = "sekali_writer_commit_duration_seconds_count 10\n";
        let run = ServerMetrics::between("b".into(), &Scrape::parse(older), &Scrape::parse(older));
        assert_eq!(run.cpu_seconds, None, "a server that does not report it");
    }
}
