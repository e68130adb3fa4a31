//! Operation metrics of mounted tenants and their Prometheus text rendering.
//!
//! Each mount counts its FUSE operations by kind (calls, errors, latency histogram) and the
//! bytes it read and wrote, with relaxed atomics (no lock on the request path). The daemon
//! renders them, with the host cache's and governor's numbers, in the Prometheus text format
//! on a loopback address (`[metrics] listen`), and `tenantfs stats` shows them as a table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Operation kinds counted per mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Lookup,
    Getattr,
    Create,
    Unlink,
    Fsync,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Read,
        Op::Write,
        Op::Lookup,
        Op::Getattr,
        Op::Create,
        Op::Unlink,
        Op::Fsync,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Create => "create",
            Op::Unlink => "unlink",
            Op::Fsync => "fsync",
        }
    }
}

/// Latency buckets: 2^i microseconds, i = 0..BUCKETS (1 us .. ~4 s), then +Inf.
const BUCKETS: usize = 23;

#[derive(Default)]
struct OpCounters {
    calls: AtomicU64,
    errors: AtomicU64,
    sum_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS + 1],
}

/// One operation kind's numbers in a [`MountActivity`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSummary {
    pub calls: u64,
    pub errors: u64,
    /// Upper bounds of the latency buckets holding the median and the 99th percentile.
    pub p50_us_le: u64,
    pub p99_us_le: u64,
}

/// What one mount has done: operations by kind (those called at least once) and bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountActivity {
    pub ops: BTreeMap<String, OpSummary>,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Requests answered over FUSE's io_uring (the rest came over /dev/fuse).
    pub ring_requests: u64,
}

/// The counters of one mount.
#[derive(Default)]
pub struct MountMetrics {
    ops: [OpCounters; 7],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    /// Requests answered over FUSE's io_uring (the rest came over /dev/fuse).
    ring_requests: AtomicU64,
}

fn bucket_of(ns: u64) -> usize {
    let us = (ns / 1000).max(1);
    ((63 - us.leading_zeros()) as usize).min(BUCKETS)
}

impl MountMetrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Records one finished operation that started at `start`.
    pub fn record(&self, op: Op, start: Instant, ok: bool) {
        let ns = start.elapsed().as_nanos() as u64;
        let c = &self.ops[op as usize];
        c.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        c.sum_ns.fetch_add(ns, Ordering::Relaxed);
        c.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_read_bytes(&self, n: u64) {
        self.read_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_written_bytes(&self, n: u64) {
        self.written_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_ring_request(&self) {
        self.ring_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A summary: per op calls, errors, p50/p99 upper bounds in microseconds; bytes.
    pub fn summary(&self) -> MountActivity {
        let mut ops = BTreeMap::new();
        for op in Op::ALL {
            let c = &self.ops[op as usize];
            let calls = c.calls.load(Ordering::Relaxed);
            if calls == 0 {
                continue;
            }
            let counts: Vec<u64> = c
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect();
            let pct = |p: f64| -> u64 {
                let want = (calls as f64 * p).ceil() as u64;
                let mut seen = 0;
                for (i, n) in counts.iter().enumerate() {
                    seen += n;
                    if seen >= want {
                        // Bucket i holds [2^i, 2^(i+1)) us: report its upper bound.
                        return 1u64 << (i + 1);
                    }
                }
                1 << (BUCKETS + 1)
            };
            ops.insert(
                op.name().to_owned(),
                OpSummary {
                    calls,
                    errors: c.errors.load(Ordering::Relaxed),
                    p50_us_le: pct(0.5),
                    p99_us_le: pct(0.99),
                },
            );
        }
        MountActivity {
            ops,
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            ring_requests: self.ring_requests.load(Ordering::Relaxed),
        }
    }

    /// Appends this mount's series, labelled with `tenant`.
    pub fn render(&self, tenant: &str, out: &mut String) {
        for op in Op::ALL {
            let c = &self.ops[op as usize];
            let l = format!("tenant=\"{tenant}\",op=\"{}\"", op.name());
            let _ = writeln!(
                out,
                "tenantfs_ops_total{{{l}}} {}",
                c.calls.load(Ordering::Relaxed)
            );
            let _ = writeln!(
                out,
                "tenantfs_op_errors_total{{{l}}} {}",
                c.errors.load(Ordering::Relaxed)
            );
            let mut cum = 0;
            for i in 0..BUCKETS {
                cum += c.buckets[i].load(Ordering::Relaxed);
                let le = (1u64 << (i + 1)) as f64 / 1e6;
                let _ = writeln!(
                    out,
                    "tenantfs_op_latency_seconds_bucket{{{l},le=\"{le}\"}} {cum}"
                );
            }
            cum += c.buckets[BUCKETS].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "tenantfs_op_latency_seconds_bucket{{{l},le=\"+Inf\"}} {cum}"
            );
            let _ = writeln!(
                out,
                "tenantfs_op_latency_seconds_sum{{{l}}} {}",
                c.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
            );
            let _ = writeln!(out, "tenantfs_op_latency_seconds_count{{{l}}} {cum}");
        }
        let _ = writeln!(
            out,
            "tenantfs_read_bytes_total{{tenant=\"{tenant}\"}} {}",
            self.read_bytes.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "tenantfs_written_bytes_total{{tenant=\"{tenant}\"}} {}",
            self.written_bytes.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "tenantfs_fuse_ring_requests_total{{tenant=\"{tenant}\"}} {}",
            self.ring_requests.load(Ordering::Relaxed)
        );
    }
}

/// The TYPE lines of the per-mount families (once per exposition).
pub fn mount_metric_types(out: &mut String) {
    out.push_str(
        "# TYPE tenantfs_ops_total counter\n\
         # TYPE tenantfs_op_errors_total counter\n\
         # TYPE tenantfs_op_latency_seconds histogram\n\
         # TYPE tenantfs_read_bytes_total counter\n\
         # TYPE tenantfs_written_bytes_total counter\n\
         # TYPE tenantfs_fuse_ring_requests_total counter\n",
    );
}

/// Serves `render()` as `text/plain; version=0.0.4` to every HTTP request on `listen`, which
/// must be a loopback address (the numbers name tenants). Runs until the process exits.
pub fn serve(
    listen: SocketAddr,
    render: Arc<dyn Fn() -> String + Send + Sync>,
) -> std::io::Result<SocketAddr> {
    if !listen.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("metrics address {listen} is not a loopback address; use 127.0.0.1 or ::1"),
        ));
    }
    let listener = TcpListener::bind(listen)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("tenantfs-metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                // Read the request head; any path gets the metrics.
                let mut reader = BufReader::new(match conn.try_clone() {
                    Ok(c) => c,
                    Err(_) => continue,
                });
                let mut line = String::new();
                while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                    line.clear();
                }
                let body = render();
                let _ = write!(
                    conn,
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_rendering() {
        assert_eq!(bucket_of(500), 0);
        assert_eq!(bucket_of(1_500), 0);
        assert_eq!(bucket_of(2_000), 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS);
        let m = MountMetrics::new();
        let t = Instant::now();
        m.record(Op::Read, t, true);
        m.record(Op::Read, t, false);
        m.add_read_bytes(4096);
        let mut out = String::new();
        m.render("alice", &mut out);
        assert!(
            out.contains("tenantfs_ops_total{tenant=\"alice\",op=\"read\"} 2"),
            "{out}"
        );
        assert!(out.contains("tenantfs_op_errors_total{tenant=\"alice\",op=\"read\"} 1"));
        assert!(out.contains("tenantfs_op_latency_seconds_count{tenant=\"alice\",op=\"read\"} 2"));
        assert!(out.contains("tenantfs_read_bytes_total{tenant=\"alice\"} 4096"));
        let s = m.summary();
        assert_eq!(s.ops["read"].calls, 2);
        assert_eq!(s.ops["read"].errors, 1);
        assert!(!s.ops.contains_key("write"));
    }

    #[test]
    fn only_loopback_is_served() {
        let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(|| "x 1\n".to_string());
        assert!(serve("0.0.0.0:0".parse().unwrap(), render.clone()).is_err());
        let addr = serve("127.0.0.1:0".parse().unwrap(), render).unwrap();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        std::io::Read::read_to_string(&mut s, &mut body).unwrap();
        assert!(
            body.starts_with("HTTP/1.0 200 OK") && body.ends_with("x 1\n"),
            "{body}"
        );
    }
}
