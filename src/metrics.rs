//! The metrics catalogue: every series a serving process exposes, with its help text, in one
//! place; the per-mount counters they read; and the loopback HTTP endpoint that serves them.
//!
//! Each mount counts its FUSE operations by kind (calls, errors, latency histogram) and the
//! bytes it read and wrote, with relaxed atomics (no lock on the request path). At a scrape,
//! the serving host's collector hands those counters and the host's numbers to
//! [`encode_mounts`] and [`encode_host`], which write them through `prometheus-client`'s
//! OpenMetrics encoder (HELP and TYPE lines, one registry per host); `tenantfs stats` reads
//! the same counters through [`MountMetrics::summary`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
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
    /// A block device's TRIM or WRITE_ZEROES (holes punched).
    Discard,
}

impl Op {
    pub const ALL: [Op; 8] = [
        Op::Read,
        Op::Write,
        Op::Lookup,
        Op::Getattr,
        Op::Create,
        Op::Unlink,
        Op::Fsync,
        Op::Discard,
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
            Op::Discard => "discard",
        }
    }
}

/// Latency buckets: 2^i microseconds, i = 0..BUCKETS (1 us .. ~4 s), then +Inf.
const BUCKETS: usize = 23;

#[derive(Debug, Default)]
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
    /// Ring submissions of replies made as SCHED_IDLE so that their callers stay on their
    /// CPU, and those that ran behind other work (each pauses the hand-off; `fuse::ring`).
    #[serde(default)]
    pub ring_handoffs: u64,
    #[serde(default)]
    pub ring_handoff_stalls: u64,
    /// Disk reads the ring made for cold reads, which waited on no thread (`serving`).
    #[serde(default)]
    pub ring_disk_reads: u64,
    /// FUSE requests answered (every opcode, both transports), and the time spent answering
    /// them, from the request's arrival in the daemon to its reply's bytes: a step's time
    /// less this is what the round trips and the caller took (see `bench_tree`).
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub busy_us: u64,
    /// The time those requests waited on the tenant's I/O limits (not in `busy_us`).
    #[serde(default)]
    pub throttled_us: u64,
    /// Bytes the tenant's store moved to and from the disk in the background (flushes,
    /// compactions, blob and extent collection, folds), charged to its byte limit.
    #[serde(default)]
    pub background_bytes: u64,
    /// Threads reading /dev/fuse for the mount now (they start on demand from one), and the
    /// most there were at once.
    #[serde(default)]
    pub fuse_workers: u64,
    #[serde(default)]
    pub fuse_workers_peak: u64,
}

/// The counters of one mount.
#[derive(Debug, Default)]
pub struct MountMetrics {
    ops: [OpCounters; 8],
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    /// Requests answered over FUSE's io_uring (the rest came over /dev/fuse).
    ring_requests: AtomicU64,
    ring_handoffs: AtomicU64,
    ring_handoff_stalls: AtomicU64,
    ring_disk_reads: AtomicU64,
    requests: AtomicU64,
    /// Time answering requests, waits on the I/O limits included (reported without them).
    busy_ns: AtomicU64,
    throttled_ns: AtomicU64,
    background_bytes: AtomicU64,
    fuse_workers: AtomicU64,
    fuse_workers_peak: AtomicU64,
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

    /// The tenant's store moved `n` bytes in the background.
    pub fn add_background_bytes(&self, n: u64) {
        self.background_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_ring_request(&self) {
        self.ring_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// The ring makes `n` disk reads for a request.
    pub fn add_ring_disk_reads(&self, n: u64) {
        self.ring_disk_reads.fetch_add(n, Ordering::Relaxed);
    }

    /// Records one hand-off of ring replies, and whether it ran behind other work.
    pub fn record_handoff(&self, stalled: bool) {
        self.ring_handoffs.fetch_add(1, Ordering::Relaxed);
        if stalled {
            self.ring_handoff_stalls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records one FUSE request (any opcode) whose answer started at `start` and is ready.
    pub fn record_request(&self, start: Instant) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.busy_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// A request waited `waited` on the tenant's I/O limits (time that is not work).
    pub fn record_throttled(&self, waited: std::time::Duration) {
        self.throttled_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
    }

    /// A request was held `held` on the tenant's I/O limits before it was answered, by no
    /// thread (the ring's timeout): counted as throttled time of its request's.
    pub fn record_held(&self, held: std::time::Duration) {
        let ns = held.as_nanos() as u64;
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
        self.throttled_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Time spent answering requests, less their waits on the I/O limits.
    fn busy_ns(&self) -> u64 {
        let busy = self.busy_ns.load(Ordering::Relaxed);
        busy.saturating_sub(self.throttled_ns.load(Ordering::Relaxed))
    }

    /// The mount's /dev/fuse workers are `n` now.
    pub fn set_fuse_workers(&self, n: usize) {
        self.fuse_workers.store(n as u64, Ordering::Relaxed);
        self.fuse_workers_peak
            .fetch_max(n as u64, Ordering::Relaxed);
    }

    /// FUSE requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
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
            ring_handoffs: self.ring_handoffs.load(Ordering::Relaxed),
            ring_handoff_stalls: self.ring_handoff_stalls.load(Ordering::Relaxed),
            ring_disk_reads: self.ring_disk_reads.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            busy_us: self.busy_ns() / 1000,
            throttled_us: self.throttled_ns.load(Ordering::Relaxed) / 1000,
            background_bytes: self.background_bytes.load(Ordering::Relaxed),
            fuse_workers: self.fuse_workers.load(Ordering::Relaxed),
            fuse_workers_peak: self.fuse_workers_peak.load(Ordering::Relaxed),
        }
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format wants them.
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// A per-mount family of one value each: a counter (its name without `_total`) or a gauge.
fn encode_mount_value(
    encoder: &mut DescriptorEncoder,
    mounts: &[(&str, &MountMetrics)],
    (name, help, kind): (&str, &str, MetricType),
    value: impl Fn(&MountMetrics) -> u64,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (tenant, m) in mounts {
        let labels = [("tenant", Escaped(tenant))];
        let series = family.encode_family(&labels)?;
        match kind {
            MetricType::Gauge => ConstGauge::new(value(m) as i64).encode(series)?,
            _ => ConstCounter::new(value(m)).encode(series)?,
        }
    }
    Ok(())
}

/// The per-mount series of `mounts` (tenant name, counters).
pub fn encode_mounts(
    encoder: &mut DescriptorEncoder,
    mounts: &[(&str, &MountMetrics)],
) -> std::fmt::Result {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    type OpValue = fn(&OpCounters) -> u64;
    let per_op: [(&str, &str, OpValue); 2] = [
        ("tenantfs_ops", "FUSE operations served, by kind.", |c| {
            c.calls.load(Ordering::Relaxed)
        }),
        (
            "tenantfs_op_errors",
            "FUSE operations answered with an error, by kind.",
            |c| c.errors.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, value) in per_op {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (tenant, m) in mounts {
            for op in Op::ALL {
                let labels = [("tenant", Escaped(tenant)), ("op", Escaped(op.name()))];
                ConstCounter::new(value(&m.ops[op as usize]))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
    }
    let mut family = encoder.encode_descriptor(
        "tenantfs_op_latency_seconds",
        "Time to serve a FUSE operation, by kind.",
        None,
        MetricType::Histogram,
    )?;
    for (tenant, m) in mounts {
        for op in Op::ALL {
            let c = &m.ops[op as usize];
            let mut buckets: Vec<(f64, u64)> = (0..BUCKETS)
                .map(|i| ((1u64 << (i + 1)) as f64 / 1e6, load(&c.buckets[i])))
                .collect();
            buckets.push((f64::MAX, load(&c.buckets[BUCKETS])));
            let count = buckets.iter().map(|b| b.1).sum();
            let labels = [("tenant", Escaped(tenant)), ("op", Escaped(op.name()))];
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    load(&c.sum_ns) as f64 / 1e9,
                    count,
                    &buckets,
                    None,
                )?;
        }
    }
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_read_bytes",
            "Bytes read from the mount.",
            MetricType::Counter,
        ),
        |m| load(&m.read_bytes),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_written_bytes",
            "Bytes written to the mount.",
            MetricType::Counter,
        ),
        |m| load(&m.written_bytes),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_background_bytes",
            "Bytes the tenant's store moved to and from the disk in the background (flushes, \
             compactions, blob and extent collection, folds), charged to its byte limit.",
            MetricType::Counter,
        ),
        |m| load(&m.background_bytes),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_fuse_ring_requests",
            "Requests answered over FUSE's io_uring (the rest came over /dev/fuse).",
            MetricType::Counter,
        ),
        |m| load(&m.ring_requests),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_fuse_ring_disk_reads",
            "Disk reads the ring made for cold reads, which waited on no thread.",
            MetricType::Counter,
        ),
        |m| load(&m.ring_disk_reads),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_fuse_ring_handoffs",
            "Ring reply submissions made as SCHED_IDLE so that their callers stay on their CPU.",
            MetricType::Counter,
        ),
        |m| load(&m.ring_handoffs),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_fuse_ring_handoff_stalls",
            "Ring hand-offs that ran behind other work (each pauses the hand-off).",
            MetricType::Counter,
        ),
        |m| load(&m.ring_handoff_stalls),
    )?;
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_fuse_requests",
            "FUSE requests answered (every opcode, both transports).",
            MetricType::Counter,
        ),
        |m| load(&m.requests),
    )?;
    let mut family = encoder.encode_descriptor(
        "tenantfs_fuse_busy_seconds",
        "Time spent answering FUSE requests, from their arrival in the daemon to their \
         replies, less their waits on the tenant's I/O limits.",
        None,
        MetricType::Counter,
    )?;
    for (tenant, m) in mounts {
        let labels = [("tenant", Escaped(tenant))];
        ConstCounter::new(m.busy_ns() as f64 / 1e9).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "tenantfs_fuse_throttled_seconds",
        "Time FUSE requests waited on the tenant's I/O limits.",
        None,
        MetricType::Counter,
    )?;
    for (tenant, m) in mounts {
        let labels = [("tenant", Escaped(tenant))];
        ConstCounter::new(load(&m.throttled_ns) as f64 / 1e9)
            .encode(family.encode_family(&labels)?)?;
    }
    encode_mount_value(
        encoder,
        mounts,
        (
            "tenantfs_fuse_workers",
            "Threads reading /dev/fuse for the mount (they start on demand from one).",
            MetricType::Gauge,
        ),
        |m| load(&m.fuse_workers),
    )
}

/// The host's numbers at a scrape.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostNumbers {
    pub mounts: u64,
    /// Mounts whose store is closed while they are idle.
    pub dormant_mounts: u64,
    /// Idle mounts' stores opened again by a request.
    pub mount_wakes: u64,
    pub cache_budget_bytes: u64,
    pub cache_used_bytes: u64,
    pub cache_resident_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub cache_released_bytes: u64,
    pub base_block_cache_hits: u64,
    pub process_rss_bytes: u64,
    pub log_lines_dropped: u64,
    pub pressure_events: u64,
    pub governor_shrinks: u64,
    pub governor_grows: u64,
}

/// A family of one unlabelled series.
fn encode_one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// The host's series.
pub fn encode_host(encoder: &mut DescriptorEncoder, h: &HostNumbers) -> std::fmt::Result {
    let gauges = [
        ("tenantfs_mounts", "Tenants mounted.", h.mounts),
        (
            "tenantfs_dormant_mounts",
            "Mounts idle with their store closed until the next request.",
            h.dormant_mounts,
        ),
        (
            "tenantfs_cache_budget_bytes",
            "The host cache's budget now (the governor may hold it under the ceiling).",
            h.cache_budget_bytes,
        ),
        (
            "tenantfs_cache_used_bytes",
            "Bytes the host cache holds.",
            h.cache_used_bytes,
        ),
        (
            "tenantfs_cache_resident_bytes",
            "Cache memory that may be resident (slabs in use and the pool of free slots).",
            h.cache_resident_bytes,
        ),
        (
            "tenantfs_process_rss_bytes",
            "Resident memory of the serving process.",
            h.process_rss_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        encode_one(encoder, name, help, &ConstGauge::new(v as i64))?;
    }
    let counters = [
        ("tenantfs_cache_hits", "Host cache hits.", h.cache_hits),
        (
            "tenantfs_mount_wakes",
            "Idle mounts' stores opened again by a request.",
            h.mount_wakes,
        ),
        (
            "tenantfs_cache_misses",
            "Host cache misses.",
            h.cache_misses,
        ),
        (
            "tenantfs_cache_evictions",
            "Entries evicted from the host cache.",
            h.cache_evictions,
        ),
        (
            "tenantfs_cache_released_bytes",
            "Cache memory given back to the kernel.",
            h.cache_released_bytes,
        ),
        (
            "tenantfs_base_block_cache_hits",
            "Base image blocks served from the host cache.",
            h.base_block_cache_hits,
        ),
        (
            "tenantfs_log_lines_dropped",
            "Log lines that could not be written (a full disk) and were dropped.",
            h.log_lines_dropped,
        ),
        (
            "tenantfs_pressure_events",
            "Governor ticks on which memory pressure was seen.",
            h.pressure_events,
        ),
        (
            "tenantfs_governor_shrinks",
            "Times the governor shrank the cache budget.",
            h.governor_shrinks,
        ),
        (
            "tenantfs_governor_grows",
            "Times the governor grew the cache budget back.",
            h.governor_grows,
        ),
    ];
    for (name, help, v) in counters {
        encode_one(encoder, name, help, &ConstCounter::new(v))?;
    }
    Ok(())
}

/// The OpenMetrics text of everything `registry` holds, with its closing `# EOF`.
pub fn exposition(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail; a collector's own error would end the text early.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "cannot encode the metrics");
    }
    out
}

/// The content type of [`exposition`]'s text.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `render()` to every HTTP request on `listen`, which must be a loopback address (the
/// numbers name tenants), each connection on a thread of its own: a client that connects and
/// stalls holds up no other scrape. Runs until the process exits.
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
                let render = render.clone();
                let spawned = std::thread::Builder::new()
                    .name("tenantfs-scrape".into())
                    .spawn(move || answer_scrape(conn, &*render));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a thread for a metrics scrape");
                }
            }
        })?;
    Ok(bound)
}

/// Reads one request head (any path gets the metrics) and answers it.
fn answer_scrape(mut conn: std::net::TcpStream, render: &(dyn Fn() -> String + Send + Sync)) {
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let Ok(head) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(head);
    let mut line = String::new();
    while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
        line.clear();
    }
    let body = render();
    let _ = write!(
        conn,
        "HTTP/1.0 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry with one collector over `mounts`, as the serving host builds it.
    fn registry(mounts: Vec<(String, Arc<MountMetrics>)>, host: HostNumbers) -> Registry {
        #[derive(Debug)]
        struct Fixed(Vec<(String, Arc<MountMetrics>)>, HostNumbers);
        impl prometheus_client::collector::Collector for Fixed {
            fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
                let mounts: Vec<(&str, &MountMetrics)> =
                    self.0.iter().map(|(t, m)| (t.as_str(), &**m)).collect();
                encode_mounts(&mut encoder, &mounts)?;
                encode_host(&mut encoder, &self.1)
            }
        }
        let mut r = Registry::default();
        r.register_collector(Box::new(Fixed(mounts, host)));
        r
    }

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
        m.add_background_bytes(65536);
        m.set_fuse_workers(3);
        m.set_fuse_workers(1);
        // Two requests answered, one of them after 2 ms of work.
        m.record_request(Instant::now());
        let busy = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        m.record_request(busy);
        let host = HostNumbers {
            mounts: 2,
            cache_hits: 7,
            ..HostNumbers::default()
        };
        let out = exposition(&registry(
            vec![
                ("alice".into(), m.clone()),
                ("we\"ird\\name\n".into(), MountMetrics::new()),
            ],
            host,
        ));
        for want in [
            "# HELP tenantfs_ops FUSE operations served, by kind.",
            "# TYPE tenantfs_ops counter",
            "tenantfs_ops_total{tenant=\"alice\",op=\"read\"} 2",
            "tenantfs_op_errors_total{tenant=\"alice\",op=\"read\"} 1",
            "# TYPE tenantfs_op_latency_seconds histogram",
            "tenantfs_op_latency_seconds_count{tenant=\"alice\",op=\"read\"} 2",
            "tenantfs_op_latency_seconds_bucket{le=\"+Inf\",tenant=\"alice\",op=\"read\"} 2",
            "tenantfs_read_bytes_total{tenant=\"alice\"} 4096",
            "tenantfs_background_bytes_total{tenant=\"alice\"} 65536",
            // A label value is escaped as the text format asks.
            "tenantfs_read_bytes_total{tenant=\"we\\\"ird\\\\name\\n\"} 0",
            "# TYPE tenantfs_fuse_workers gauge",
            "tenantfs_fuse_workers{tenant=\"alice\"} 1",
            "tenantfs_fuse_requests_total{tenant=\"alice\"} 2",
            "# TYPE tenantfs_fuse_busy_seconds counter",
            "tenantfs_fuse_busy_seconds_total{tenant=\"alice\"} 0.00",
            "# TYPE tenantfs_fuse_throttled_seconds counter",
            "tenantfs_fuse_throttled_seconds_total{tenant=\"alice\"} 0.0",
            "# TYPE tenantfs_mounts gauge",
            "tenantfs_mounts 2",
            "# HELP tenantfs_cache_hits Host cache hits.",
            "tenantfs_cache_hits_total 7",
        ] {
            assert!(out.contains(want), "{want:?} not in\n{out}");
        }
        assert!(out.ends_with("# EOF\n"), "{out}");
        // The summary `tenantfs stats` shows reads the same counters.
        let s = m.summary();
        assert_eq!(s.ops["read"].calls, 2);
        assert_eq!(s.ops["read"].errors, 1);
        assert!(!s.ops.contains_key("write"));
        assert_eq!((s.fuse_workers, s.fuse_workers_peak), (1, 3));
        assert_eq!(s.requests, 2);
        assert_eq!(s.background_bytes, 65536);
        assert!(s.busy_us >= 2_000, "{}", s.busy_us);
        assert!(
            s.busy_us < t.elapsed().as_micros() as u64 + 1,
            "{}",
            s.busy_us
        );
    }

    #[test]
    fn a_stalled_client_holds_up_no_other_scrape() {
        let render: Arc<dyn Fn() -> String + Send + Sync> = Arc::new(|| "x 1\n".to_string());
        let addr = serve("127.0.0.1:0".parse().unwrap(), render).unwrap();
        // Connects and sends nothing: its thread waits up to 5 s for the request head.
        let _stalled = std::net::TcpStream::connect(addr).unwrap();
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        // Well under those 5 s: served one after the other, this read would time out.
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        std::io::Read::read_to_string(&mut s, &mut body).unwrap();
        assert!(body.ends_with("x 1\n"), "{body}");
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
