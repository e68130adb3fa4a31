//! Weighted fair sharing of a serving process between busy tenants: each mount has a weight
//! (`weight=N`, default [`DEFAULT_WEIGHT`]); while tenants are busy at once, each gets the
//! daemon's serving time in proportion to its weight.
//!
//! How: virtual time, as start-time fair queueing keeps it, charged by service time: each
//! request served advances its tenant's virtual time by the time it took over the weight (so
//! a tenant whose reads wait on the disk pays for that wait, and one whose reads come from the
//! cache pays little). A request is held while its tenant is more than [`LAG`] ahead of the
//! least advanced other busy tenant, and let in as soon as that one catches up or stops being
//! busy: a tenant alone, or beside only idle ones, is never held. Busy means a request in the
//! queue, or one served less than [`ANTICIPATE`] ago (its caller is between two requests: a
//! tenant issuing one request after another is busy all along). A tenant that becomes busy
//! again starts at the least advanced busy one's time (the latest start when none is busy),
//! never behind: an idle tenant banks nothing. Holding the request, not just ordering it, is
//! what makes it work on a host whose CPUs go mostly to the tenants' own processes and the
//! kernel: a held tenant's callers sleep, and their CPU time goes to the others.
//!
//! Until some mount of the process is given a weight, requests pass without looking at the
//! queue: sharing costs nothing on hosts that do not use it. From then on every mount's data
//! requests (reads, writes, copies) take a turn, after their tenant's own limits
//! (`io_limits`).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A mount's weight when none is given.
pub const DEFAULT_WEIGHT: u32 = 100;
/// The largest weight (a weight of 10,000 against 1 is a share of 99.99%).
pub const MAX_WEIGHT: u32 = 10_000;
/// How far ahead of the least advanced busy tenant a tenant may run, in virtual time: 200 us
/// of service at the default weight (virtual time is nanoseconds at the default weight).
pub const LAG: u64 = 200_000;
/// A held request looks again after this long.
pub const RECHECK: Duration = Duration::from_micros(50);

/// One tenant mount's place in the queue: its weight and virtual time.
#[derive(Debug)]
pub struct Share {
    id: u64,
    weight: AtomicU32,
}

impl Share {
    pub fn new(weight: Option<NonZeroU32>) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        Share {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            weight: AtomicU32::new(weight.map_or(DEFAULT_WEIGHT, NonZeroU32::get)),
        }
    }

    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    pub fn set_weight(&self, weight: Option<NonZeroU32>) {
        let w = weight
            .map_or(DEFAULT_WEIGHT, NonZeroU32::get)
            .min(MAX_WEIGHT);
        self.weight.store(w, Ordering::Relaxed);
    }
}

impl Drop for Share {
    /// A mount that is gone leaves the process's queue.
    fn drop(&mut self) {
        host().forget_id(self.id);
    }
}

/// The queue of one serving process.
pub struct FairShare {
    /// Some mount was given a weight: every data request takes a turn.
    engaged: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    tenants: HashMap<u64, Tenant>,
    /// The latest virtual start let in: where a tenant that becomes busy while no other is
    /// starts.
    clock: u64,
}

/// A tenant's virtual time and its requests in the queue.
#[derive(Default)]
struct Tenant {
    time: u64,
    /// Requests let in and not yet served, and requests held.
    busy: u32,
    /// When its last request was served.
    done: Option<Instant>,
}

impl Tenant {
    /// A request in the queue, or one served so recently that the next is on its way.
    fn is_busy(&self, now: Instant) -> bool {
        self.busy > 0
            || self
                .done
                .is_some_and(|d| now.duration_since(d) < ANTICIPATE)
    }
}

/// A tenant whose last request was served this recently counts as busy: its caller is
/// between two requests.
pub const ANTICIPATE: Duration = Duration::from_micros(100);

/// The process's queue.
pub fn host() -> &'static FairShare {
    static HOST: OnceLock<FairShare> = OnceLock::new();
    HOST.get_or_init(FairShare::new)
}

/// A request's turn: held while it is served; its service time is charged when it drops.
/// (The default turn is none: nothing is charged.)
#[must_use]
#[derive(Default)]
pub struct Turn<'a> {
    queue: Option<(&'a FairShare, &'a Share, Instant)>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if let Some((q, share, admitted)) = self.queue {
            q.leave(share, admitted.elapsed());
        }
    }
}

impl Turn<'_> {
    /// Charges `wait` besides the turn's own time: a request answered again after its disk
    /// reads were made (the FUSE ring's) is charged that wait, as a read that waits on the
    /// disk within its turn is. Not the time it was held before either turn: charged as
    /// service, a hold would put its tenant further ahead, to be held longer the next time.
    pub fn also_charged(mut self, wait: Duration) -> Self {
        if let Some((_, _, admitted)) = &mut self.queue {
            *admitted = admitted.checked_sub(wait).unwrap_or(*admitted);
        }
        self
    }
}

impl Default for FairShare {
    fn default() -> Self {
        Self::new()
    }
}

impl FairShare {
    pub fn new() -> Self {
        FairShare {
            engaged: AtomicBool::new(false),
            state: Mutex::new(State::default()),
        }
    }

    /// From now on every data request takes a turn (some mount has a weight).
    pub fn engage(&self) {
        self.engaged.store(true, Ordering::Release);
    }

    pub fn is_engaged(&self) -> bool {
        self.engaged.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the turn of a request of `share`; the time held is the caller's to count.
    pub fn enter<'a>(&'a self, share: &'a Share) -> Turn<'a> {
        let mut held = false;
        loop {
            if let Some(turn) = self.try_enter(share, &mut held) {
                return turn;
            }
            crate::serving::will_wait();
            std::thread::sleep(RECHECK);
        }
    }

    /// The turn of a request of `share` if it may be served now; else `None`: the request
    /// is held (counted busy once, `held` set), and tries again after [`RECHECK`] with the
    /// same `held`, or is given up with [`Self::let_go`]. A thread that can wait without
    /// blocking (the FUSE ring, on a timeout) holds requests this way.
    pub fn try_enter<'a>(&'a self, share: &'a Share, held: &mut bool) -> Option<Turn<'a>> {
        if !self.is_engaged() {
            return Some(Turn { queue: None });
        }
        let mut state = self.lock();
        let State { tenants, clock } = &mut *state;
        let now = Instant::now();
        let least_other = tenants
            .iter()
            .filter(|(id, t)| **id != share.id && t.is_busy(now))
            .map(|(_, t)| t.time)
            .min();
        let me = tenants.entry(share.id).or_default();
        if !me.is_busy(now) && !*held {
            // Busy again: from the least advanced busy tenant's time (the clock when none
            // is), never behind.
            me.time = me.time.max(least_other.unwrap_or(*clock));
        }
        if !*held {
            me.busy += 1;
        }
        match least_other {
            Some(least) if me.time > least + LAG => {
                *held = true;
                None
            }
            _ => {
                *held = false;
                *clock = (*clock).max(me.time);
                Some(Turn {
                    queue: Some((self, share, now)),
                })
            }
        }
    }

    /// A request held for its turn ([`Self::try_enter`]) is given up: it is not busy any more.
    pub fn let_go(&self, share: &Share) {
        if let Some(t) = self.lock().tenants.get_mut(&share.id) {
            t.busy = t.busy.saturating_sub(1);
        }
    }

    /// A request of `share` was served in `took`: its tenant's time advances by that over
    /// its weight.
    fn leave(&self, share: &Share, took: Duration) {
        let weight = u64::from(share.weight().max(1));
        let cost = (took.as_nanos() as u64).saturating_mul(u64::from(DEFAULT_WEIGHT)) / weight;
        let mut state = self.lock();
        if let Some(t) = state.tenants.get_mut(&share.id) {
            t.time = t.time.saturating_add(cost.max(1));
            t.busy = t.busy.saturating_sub(1);
            t.done = Some(Instant::now());
        }
    }

    fn forget_id(&self, id: u64) {
        self.lock().tenants.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn an_unengaged_queue_lets_everything_through() {
        let q = FairShare::new();
        let s = Share::new(None);
        let a = q.enter(&s);
        let b = q.enter(&s);
        drop((a, b));
        assert!(q.lock().tenants.is_empty());
    }

    /// Two tenants kept busy (two threads each, as a mount's queue threads of two CPUs),
    /// weights 1 and 3: the second is served three times as often.
    #[test]
    fn busy_tenants_are_served_in_proportion_to_their_weights() {
        let q = Arc::new(FairShare::new());
        q.engage();
        let shares = [
            Arc::new(Share::new(NonZeroU32::new(100))),
            Arc::new(Share::new(NonZeroU32::new(300))),
        ];
        let served = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let (q, share, served, stop) = (
                    q.clone(),
                    shares[i % 2].clone(),
                    served.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _turn = q.enter(&share);
                        served[i % 2].fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_micros(100));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1000));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let [light, heavy] = [0, 1].map(|i| served[i].load(Ordering::Relaxed) as f64);
        let share = heavy / (light + heavy);
        assert!(
            (0.70..=0.80).contains(&share),
            "weight 3 of 4 got {share:.3} of {} turns",
            light + heavy
        );
        assert!(q.lock().tenants.values().all(|t| t.busy == 0));
    }

    /// A request held without a thread (`try_enter`) is counted busy once however often it
    /// looks, gets its turn once the other catches up, and a request given up (`let_go`)
    /// leaves its tenant idle.
    #[test]
    fn a_request_held_without_a_thread_is_counted_once_and_let_go() {
        let q = FairShare::new();
        q.engage();
        let (a, b) = (Share::new(None), Share::new(None));
        let busy = |q: &FairShare, s: &Share| q.lock().tenants[&s.id].busy;
        // b is busy; a served 1 ms beyond it.
        let b_turn = q.enter(&b);
        drop(q.enter(&a).also_charged(Duration::from_millis(1)));
        let mut held = false;
        for _ in 0..3 {
            assert!(q.try_enter(&a, &mut held).is_none(), "a is ahead: held");
            assert!(held);
        }
        assert_eq!(busy(&q, &a), 1, "counted busy once, however often it looks");
        q.let_go(&a);
        assert_eq!(busy(&q, &a), 0, "given up: not busy");
        // b catches up (served 2 ms): a's next request gets its turn, and resets `held`.
        drop(b_turn.also_charged(Duration::from_millis(2)));
        let mut held = true;
        q.lock().tenants.get_mut(&a.id).unwrap().busy = 1; // as held, not yet let go
        let turn = q.try_enter(&a, &mut held).expect("its turn");
        assert!(!held);
        drop(turn);
        assert_eq!(busy(&q, &a), 0);
    }

    /// A request answered twice (its disk reads made by the ring between) is charged both
    /// answers and the disk wait between them, not a hold.
    #[test]
    fn a_request_answered_again_is_charged_its_disk_wait() {
        let q = FairShare::new();
        q.engage();
        let s = Share::new(None);
        let time = |q: &FairShare| q.lock().tenants[&s.id].time;
        drop(q.enter(&s));
        let before = time(&q);
        drop(q.enter(&s).also_charged(Duration::from_millis(20)));
        let charged = time(&q) - before;
        assert!(
            (20_000_000..30_000_000).contains(&charged),
            "the disk wait was not charged as it was: {charged} ns"
        );
        assert!(q.lock().tenants.values().all(|t| t.busy == 0));
    }

    /// A tenant alone, or beside one that is not busy, is never held.
    #[test]
    fn a_tenant_alone_is_never_held() {
        let q = FairShare::new();
        q.engage();
        let (light, heavy) = (Share::new(NonZeroU32::new(1)), Share::new(None));
        // heavy was busy once and is far behind: it is not busy now, so it holds nothing.
        drop(q.enter(&heavy));
        std::thread::sleep(ANTICIPATE * 2);
        let t = Instant::now();
        for _ in 0..1000 {
            drop(q.enter(&light));
        }
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        // Busy again, heavy starts where light got to: it banked nothing while idle, and
        // light, which used what nobody else wanted, owes nothing.
        let _turn = q.enter(&heavy);
        let state = q.lock();
        let (l, h) = (state.tenants[&light.id].time, state.tenants[&heavy.id].time);
        assert!(h + LAG >= l, "heavy {h}, light {l}");
    }
}
