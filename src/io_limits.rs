//! A tenant's I/O limits: at most so many data requests (reads and writes) a second and so
//! many bytes a second, each a token bucket (GCRA, the `governor` crate) that a request waits
//! on before it is answered. A limited tenant waits on its own buckets only: a thread that is
//! to wait for tokens first gives its lead over other tenants' requests to another
//! ([`crate::serving`]), so no other tenant waits with it.
//!
//! Bursts are short (a fiftieth of a second's worth), so a limit holds over any run longer
//! than a fraction of a second; a request larger than the byte bucket's burst takes its
//! tokens in pieces. Bytes are counted in KiB (a request's size rounded up), so a limit of up
//! to 4 TiB/s fits the bucket's 32-bit counts.
//!
//! A byte limit also covers the disk work done for the tenant in the background (its store's
//! flushes and compactions, blob and extent collection, folds: `store::BackgroundWork`).
//! RocksDB's part is never held: it runs on threads all tenants share, and holding one for a
//! limited tenant would hold the others' work behind it (the volume's own folds and
//! collections wait for the debt before they start: `store::BackgroundWork::hold`). All of
//! it is charged, as it is
//! done, to a debt clock that runs ahead by the time the limit gives those bytes, counted
//! from when the work began or from the tenant's last request, whichever is later (only time
//! the tenant left unused pays for it), and the tenant's requests wait until the clock is
//! back. Each request waits at most [`MAX_DEBT_WAIT`] on it (a block device's kernel gives
//! up on a request after a few seconds), so in debt a tenant's requests go at about one a
//! second for each it has in flight until the clock is back. The clock is at most
//! [`MAX_DEBT`] ahead: what lies beyond is forgiven.

use std::num::{NonZeroU32, NonZeroU64};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::fair_share::{self, Share, Turn};
use crate::metrics::MountMetrics;
use crate::store::BackgroundAccount;

/// What a limited tenant may do a second; `None`: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoLimits {
    /// Data requests (reads and writes) a second.
    pub iops: Option<NonZeroU32>,
    /// Bytes read and written a second.
    pub bandwidth: Option<NonZeroU64>,
    /// The mount's weight among busy tenants (see `fair_share`); `None`: the default.
    pub weight: Option<NonZeroU32>,
}

impl IoLimits {
    /// No request or byte limit (a weight limits nothing).
    pub fn is_unlimited(&self) -> bool {
        self.iops.is_none() && self.bandwidth.is_none()
    }
}

/// The most a tenant's background work puts its debt clock ahead of now.
pub const MAX_DEBT: Duration = Duration::from_secs(10);

/// The longest one request waits on the debt clock.
pub const MAX_DEBT_WAIT: Duration = Duration::from_secs(1);

/// Debts smaller than this are not waited for (the byte bucket's burst is as long).
const DEBT_GRACE: Duration = Duration::from_millis(20);

/// The buckets of one tenant's limits.
pub struct Throttle {
    requests: Option<Bucket>,
    kib: Option<Bucket>,
    /// With a byte limit: its debt clock (see the module's doc).
    debt: Option<DebtClock>,
    clock: DefaultClock,
}

/// The time the limit gives the background bytes charged to a tenant, as a clock that runs
/// ahead of now: nanoseconds from [`EPOCH`] at which the tenant has paid for them.
struct DebtClock {
    bytes_per_second: u64,
    paid_until_ns: AtomicI64,
}

/// Where debt clocks count from (a time before it counts as negative).
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn since_epoch(t: Instant) -> i64 {
    match t.checked_duration_since(*EPOCH) {
        Some(after) => after.as_nanos() as i64,
        None => -(EPOCH.duration_since(t).as_nanos() as i64),
    }
}

impl DebtClock {
    /// Charges `bytes` of background work that began at `started`: the clock moves on from
    /// then (or from where it stood, if later) by their time at the limit, at most
    /// [`MAX_DEBT`] ahead of now.
    fn charge(&self, bytes: u64, started: Instant) {
        let cost = (u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_second))
            .min(i64::MAX as u128) as i64;
        let now = since_epoch(Instant::now());
        let started = since_epoch(started).min(now);
        let cap = now.saturating_add(MAX_DEBT.as_nanos() as i64);
        let _ = self
            .paid_until_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |until| {
                Some(until.max(started).saturating_add(cost).min(cap))
            });
    }

    /// How long a request waits for the debt, if it must ([`MAX_DEBT_WAIT`] at most).
    fn wait(&self) -> Option<Duration> {
        let until = self.paid_until_ns.load(Ordering::Relaxed);
        let ahead =
            Duration::from_nanos(until.saturating_sub(since_epoch(Instant::now())).max(0) as u64);
        (ahead > DEBT_GRACE).then(|| (ahead - DEBT_GRACE).min(MAX_DEBT_WAIT))
    }

    /// A request of the tenant is admitted: the time until now was not left unused.
    fn used_until_now(&self) {
        self.paid_until_ns
            .fetch_max(since_epoch(Instant::now()), Ordering::Relaxed);
    }
}

/// One token bucket and the most tokens one check may take.
struct Bucket {
    limiter: DefaultDirectRateLimiter,
    burst: NonZeroU32,
}

/// A bucket of `per_second` tokens a second, `burst` at most at once.
fn bucket(per_second: NonZeroU32, burst: u32) -> Bucket {
    let burst = NonZeroU32::new(burst.clamp(1, per_second.get())).unwrap_or(NonZeroU32::MIN);
    Bucket {
        limiter: RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst)),
        burst,
    }
}

impl Throttle {
    /// The buckets of `limits`; `None` when nothing is limited.
    pub fn new(limits: IoLimits) -> Option<Self> {
        if limits.is_unlimited() {
            return None;
        }
        let requests = limits.iops.map(|iops| bucket(iops, iops.get() / 50));
        let kib = limits.bandwidth.map(|bytes| {
            let per_second = u32::try_from(bytes.get().div_ceil(1024))
                .unwrap_or(u32::MAX)
                .max(1);
            let per_second = NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN);
            bucket(per_second, per_second.get() / 50)
        });
        let debt = limits.bandwidth.map(|bytes| DebtClock {
            bytes_per_second: bytes.get(),
            paid_until_ns: AtomicI64::new(i64::MIN),
        });
        Some(Self {
            requests,
            kib,
            debt,
            clock: DefaultClock::default(),
        })
    }

    /// Charges `bytes` of disk work done for the tenant in the background since `started`
    /// to the byte limit (nothing without one).
    pub fn charge_background(&self, bytes: u64, started: Instant) {
        if let Some(d) = &self.debt {
            d.charge(bytes, started);
        }
    }

    /// Goes on with the debt clock of `earlier` (the buckets this one replaces) if both have
    /// a byte limit: changing a limit forgives no debt.
    fn keep_debt_of(&self, earlier: &Throttle) {
        if let (Some(now), Some(before)) = (&self.debt, &earlier.debt) {
            let until = before.paid_until_ns.load(Ordering::Relaxed);
            now.paid_until_ns.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Waits until a data request of `bytes` may be answered (one moving no bytes, as a
    /// discard, takes only a request's token); how long it slept.
    pub fn wait(&self, bytes: u64) -> Duration {
        let mut slept = Duration::ZERO;
        if let Some(wait) = self.debt.as_ref().and_then(DebtClock::wait) {
            crate::serving::will_wait();
            std::thread::sleep(wait);
            slept += wait;
        }
        if let Some(b) = &self.requests {
            slept += self.take(b, 1);
        }
        if let (Some(b), true) = (&self.kib, bytes > 0) {
            slept += self.take(b, bytes.div_ceil(1024));
        }
        if let Some(d) = &self.debt {
            d.used_until_now();
        }
        slept
    }

    /// Takes `tokens` from `b`, in pieces of at most its burst, sleeping until each is there;
    /// how long it slept.
    fn take(&self, b: &Bucket, mut tokens: u64) -> Duration {
        let mut slept = Duration::ZERO;
        while tokens > 0 {
            match self.take_piece(b, tokens) {
                Ok(piece) => tokens -= piece,
                Err(wait) => {
                    crate::serving::will_wait();
                    std::thread::sleep(wait);
                    slept += wait;
                }
            }
        }
        slept
    }

    /// Takes the next piece (at most the burst) of `tokens` from `b` if it is there: the
    /// tokens taken, or how long until they are.
    fn take_piece(&self, b: &Bucket, tokens: u64) -> Result<u64, Duration> {
        let piece = tokens.min(u64::from(b.burst.get())) as u32;
        let n = NonZeroU32::new(piece).unwrap_or(NonZeroU32::MIN);
        match b.limiter.check_n(n) {
            Ok(Ok(())) => Ok(u64::from(piece)),
            Ok(Err(not_until)) => Err(not_until
                .wait_time_from(self.clock.now())
                .max(Duration::from_micros(50))),
            // A piece is never above the burst.
            Err(_) => Ok(u64::from(piece)),
        }
    }

    /// Takes what is there of the tokens of a data request of `bytes`, without waiting,
    /// going on from `paid` (what earlier calls for the same request took): `None` once all
    /// are taken, else how long until the next piece is there.
    pub fn try_pay(&self, bytes: u64, paid: &mut Paid) -> Option<Duration> {
        if !paid.debt {
            paid.debt = true;
            if let Some(wait) = self.debt.as_ref().and_then(DebtClock::wait) {
                return Some(wait);
            }
        }
        if let (Some(b), false) = (&self.requests, paid.request) {
            if let Err(wait) = self.take_piece(b, 1) {
                return Some(wait);
            }
            paid.request = true;
        }
        if let Some(b) = &self.kib {
            let kib = bytes.div_ceil(1024);
            while paid.kib < kib {
                match self.take_piece(b, kib - paid.kib) {
                    Ok(n) => paid.kib += n,
                    Err(wait) => return Some(wait),
                }
            }
        }
        if let Some(d) = &self.debt {
            d.used_until_now();
        }
        None
    }
}

/// The account a store reports its background work to (`store::BackgroundSink`) for a
/// tenant served within `limits`: counted in `metrics`, charged to the limits' debt clock,
/// which the volume's own background work also waits for.
pub fn background_sink(
    limits: &Arc<LiveLimits>,
    metrics: &Arc<MountMetrics>,
) -> crate::store::BackgroundSink {
    Arc::new(TenantAccount {
        limits: Arc::clone(limits),
        metrics: Arc::clone(metrics),
    })
}

struct TenantAccount {
    limits: Arc<LiveLimits>,
    metrics: Arc<MountMetrics>,
}

impl BackgroundAccount for TenantAccount {
    fn charge(&self, bytes: u64, started: Instant) {
        self.metrics.add_background_bytes(bytes);
        self.limits.charge_background(bytes, started);
    }

    fn due_in(&self) -> Option<Duration> {
        let state = self.limits.state.read().unwrap_or_else(|p| p.into_inner());
        state.1.as_ref()?.debt.as_ref()?.wait()
    }
}

/// What a request waiting without a thread has taken of its tokens so far (see
/// [`LiveLimits::pay_ahead`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paid {
    /// The wait on the debt clock is over (there is one per request).
    debt: bool,
    request: bool,
    kib: u64,
}

thread_local! {
    /// Set while a request admitted ahead is answered: its admission takes nothing.
    static ADMITTED_AHEAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, answering a request admitted ahead: its tokens taken ([`LiveLimits::pay_ahead`])
/// and its turn held by the caller ([`LiveLimits::try_turn`]), so that its admission takes
/// neither again.
pub fn with_admitted_ahead<R>(f: impl FnOnce() -> R) -> R {
    /// Clears the flag after `f`, also when it panics.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            ADMITTED_AHEAD.set(false);
        }
    }
    ADMITTED_AHEAD.set(true);
    let _clear = Clear;
    f()
}

/// The limits in force on one thing that serves a tenant (a mount, a block device), their
/// buckets and its place in the process's fair queue, changed while it serves: a request takes
/// the buckets current when it comes.
pub struct LiveLimits {
    state: RwLock<(IoLimits, Option<Arc<Throttle>>)>,
    share: Share,
}

impl Default for LiveLimits {
    fn default() -> Self {
        Self {
            state: RwLock::default(),
            share: Share::new(None),
        }
    }
}

impl LiveLimits {
    /// From now on, requests wait on `limits` (new, empty buckets) and take their turns by
    /// its weight (which engages the process's fair queue).
    pub fn set(&self, limits: IoLimits) {
        self.share.set_weight(limits.weight);
        if limits.weight.is_some() {
            fair_share::host().engage();
        }
        let throttle = Throttle::new(limits).map(Arc::new);
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if let (Some(new), Some(old)) = (&throttle, &state.1) {
            new.keep_debt_of(old);
        }
        *state = (limits, throttle);
    }

    pub fn get(&self) -> IoLimits {
        self.state.read().unwrap_or_else(|p| p.into_inner()).0
    }

    /// Charges `bytes` of disk work done for the tenant in the background since `started` to
    /// the byte limit in force (see the module's doc).
    pub fn charge_background(&self, bytes: u64, started: Instant) {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = &state.1 {
            t.charge_background(bytes, started);
        }
    }

    /// Takes the tokens of a data request of `bytes` that are there, going on from `paid`,
    /// without waiting: `None` once it has them all (or nothing is limited), else how long
    /// until the next are there. A transport that can hold a request without a thread (the
    /// FUSE ring) pays this way, then answers it [`with_admitted_ahead`].
    pub fn pay_ahead(&self, bytes: u64, paid: &mut Paid) -> Option<Duration> {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.1.as_ref()?.try_pay(bytes, paid)
    }

    /// Waits until a data request of `bytes` is within the limits (unless paid ahead), then
    /// for its turn among the busy tenants' requests; the wait is recorded in `metrics` as
    /// throttled time (not the request's own). The turn is held while the request is served.
    pub fn admit(&self, bytes: u64, metrics: &MountMetrics) -> Turn<'_> {
        if ADMITTED_AHEAD.replace(false) {
            return Turn::default();
        }
        let throttle = self
            .state
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone();
        let queue = fair_share::host();
        if throttle.is_none() && !queue.is_engaged() {
            return queue.enter(&self.share);
        }
        let t = Instant::now();
        if let Some(t) = &throttle {
            t.wait(bytes);
        }
        let turn = queue.enter(&self.share);
        metrics.record_throttled(t.elapsed());
        turn
    }

    /// A data request's turn among the busy tenants' if it may be served now, without
    /// waiting (see `fair_share::FairShare::try_enter`, whose `held` this is).
    pub fn try_turn(&self, held: &mut bool) -> Option<Turn<'_>> {
        fair_share::host().try_enter(&self.share, held)
    }

    /// A request held for its turn ([`Self::try_turn`]) is given up.
    pub fn let_go(&self) {
        fair_share::host().let_go(&self.share);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paying_ahead_takes_what_is_there_and_goes_on_where_it_stopped() {
        let t = Throttle::new(IoLimits {
            iops: NonZeroU32::new(1000),
            bandwidth: NonZeroU64::new(1 << 20),
            ..IoLimits::default()
        })
        .unwrap();
        // 1 MiB/s: a burst of 20 KiB. A 64 KiB request takes it, then waits for more.
        let mut paid = Paid::default();
        let start = Instant::now();
        let wait = t.try_pay(64 << 10, &mut paid).expect("more than the burst");
        assert!(paid.request && paid.kib == 20, "{paid:?}");
        assert!(
            wait > Duration::ZERO && wait < Duration::from_millis(100),
            "{wait:?}"
        );
        while let Some(wait) = t.try_pay(64 << 10, &mut paid) {
            std::thread::sleep(wait);
        }
        assert_eq!(paid.kib, 64);
        // The 44 KiB beyond the burst came at 1 KiB a millisecond.
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(40), "{took:?}");
        // Paid ahead, the admission takes nothing more.
        let limits = LiveLimits::default();
        limits.set(IoLimits {
            iops: NonZeroU32::new(1),
            ..IoLimits::default()
        });
        let metrics = MountMetrics::new();
        let mut paid = Paid::default();
        assert_eq!(limits.pay_ahead(4096, &mut paid), None);
        let start = Instant::now();
        with_admitted_ahead(|| drop(limits.admit(4096, &metrics)));
        assert!(start.elapsed() < Duration::from_millis(500));
        assert!(limits.pay_ahead(4096, &mut Paid::default()).is_some());
    }

    /// How far `t`'s debt clock is ahead of now.
    fn debt_ahead(t: &Throttle) -> Duration {
        let until = t
            .debt
            .as_ref()
            .unwrap()
            .paid_until_ns
            .load(Ordering::Relaxed);
        Duration::from_nanos((until - since_epoch(Instant::now())).max(0) as u64)
    }

    /// Background bytes put the debt clock ahead by their time at the limit, from when their
    /// work began or the tenant's last request: only time the tenant left unused pays for
    /// them. A debt holds a request (with or without a thread) once, at most
    /// `MAX_DEBT_WAIT`; the clock is at most `MAX_DEBT` ahead; a change of limits keeps it.
    #[test]
    fn background_work_is_paid_by_the_next_requests() {
        let limits = IoLimits {
            bandwidth: NonZeroU64::new(1 << 20),
            ..IoLimits::default()
        };
        let t = Throttle::new(limits).unwrap();
        // 1 MiB of work that began 2 s ago fits in the 2 s the tenant left unused.
        t.charge_background(1 << 20, Instant::now() - Duration::from_secs(2));
        assert_eq!(t.try_pay(4096, &mut Paid::default()), None);
        // That request used the time until now: the same work again costs its whole second.
        t.charge_background(1 << 20, Instant::now() - Duration::from_secs(2));
        let ahead = debt_ahead(&t);
        assert!(ahead > Duration::from_millis(900), "{ahead:?}");

        let t = Throttle::new(limits).unwrap();
        let start = Instant::now();
        // 256 KiB of work beginning now: a quarter of a second.
        t.charge_background(256 << 10, Instant::now());
        let mut paid = Paid::default();
        let wait = t.try_pay(4096, &mut paid).expect("a debt");
        assert!(
            wait > Duration::from_millis(150) && wait <= Duration::from_millis(250),
            "{wait:?}"
        );
        // Once waited for, the same request goes on to its tokens.
        assert_eq!(t.try_pay(4096, &mut paid), None);
        // A request on a thread sleeps until the clock is back.
        t.wait(4096);
        assert!(
            start.elapsed() >= Duration::from_millis(225),
            "{:?}",
            start.elapsed()
        );
        // 1 GiB would be 1,024 s: the clock stops at MAX_DEBT, a request waits MAX_DEBT_WAIT.
        t.charge_background(1 << 30, Instant::now());
        let ahead = debt_ahead(&t);
        assert!(
            ahead > MAX_DEBT - Duration::from_secs(1) && ahead <= MAX_DEBT,
            "{ahead:?}"
        );
        assert_eq!(t.try_pay(4096, &mut Paid::default()), Some(MAX_DEBT_WAIT));

        // Without a byte limit, background work is counted, not charged.
        let live = Arc::new(LiveLimits::default());
        live.set(IoLimits {
            iops: NonZeroU32::new(1000),
            ..IoLimits::default()
        });
        let metrics = MountMetrics::new();
        let sink = background_sink(&live, &metrics);
        sink.charge(1 << 30, Instant::now());
        assert_eq!(metrics.summary().background_bytes, 1 << 30);
        assert_eq!(live.pay_ahead(4096, &mut Paid::default()), None);
        assert_eq!(sink.due_in(), None);
        live.set(limits);
        sink.charge(1 << 20, Instant::now());
        assert!(live.pay_ahead(4096, &mut Paid::default()).is_some());
        // The volume's own background work waits for the debt too.
        assert!(sink.due_in().is_some());
        // A new IOPS limit beside the same byte limit forgives nothing.
        live.set(IoLimits {
            iops: NonZeroU32::new(1000),
            ..limits
        });
        assert!(live.pay_ahead(4096, &mut Paid::default()).is_some());
    }

    #[test]
    fn nothing_limited_is_no_throttle() {
        assert!(Throttle::new(IoLimits::default()).is_none());
    }

    #[test]
    fn requests_and_bytes_wait_their_turn() {
        let t = Throttle::new(IoLimits {
            iops: NonZeroU32::new(1000),
            ..IoLimits::default()
        })
        .unwrap();
        let start = std::time::Instant::now();
        for _ in 0..220 {
            t.wait(4096);
        }
        // 220 requests at 1,000 a second, a burst of 20: at least 0.2 s.
        assert!(
            start.elapsed() >= Duration::from_millis(195),
            "{:?}",
            start.elapsed()
        );

        let t = Throttle::new(IoLimits {
            bandwidth: NonZeroU64::new(8 << 20),
            ..IoLimits::default()
        })
        .unwrap();
        let start = std::time::Instant::now();
        // 4 MiB at 8 MiB/s in 1 MiB requests, each larger than the 164 KiB burst.
        for _ in 0..4 {
            t.wait(1 << 20);
        }
        assert!(
            start.elapsed() >= Duration::from_millis(480),
            "{:?}",
            start.elapsed()
        );
    }
}
