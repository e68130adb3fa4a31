//! `Policy` on fixture samples.

use super::*;
use crate::pressure::signals::Psi;

const GIB: u64 = 1 << 30;

fn v2(current: u64, max: Option<u64>, high: Option<u64>, events: (u64, u64, u64)) -> Sample {
    Sample {
        cgroup: Some(CgroupState {
            current,
            max,
            high,
            high_events: events.0,
            max_events: events.1,
            oom_events: events.2,
            inactive_file: 0,
        }),
        ..Sample::default()
    }
}

fn v1(current: u64, limit: u64, failcnt: u64, oom_kill: u64) -> Sample {
    Sample {
        cgroup: Some(CgroupState {
            current,
            max: Some(limit),
            max_events: failcnt,
            oom_events: oom_kill,
            ..CgroupState::default()
        }),
        cgroup_v1: true,
        ..Sample::default()
    }
}

fn psi(avg10: f64) -> Option<PsiPair> {
    Some(PsiPair {
        some: Psi {
            avg10,
            ..Psi::default()
        },
        full: Psi::default(),
    })
}

fn fired(mut s: Sample) -> Sample {
    s.triggers.host_psi = true;
    s
}

fn shrink_to(d: &Decision) -> u64 {
    match d {
        Decision::Shrink { to, .. } => *to,
        other => panic!("expected a shrink, got {other:?}"),
    }
}

fn grow_to(d: &Decision) -> u64 {
    match d {
        Decision::Grow { to, .. } => *to,
        other => panic!("expected a grow, got {other:?}"),
    }
}

fn reason(d: &Decision) -> &str {
    match d {
        Decision::Shrink { reason, .. } | Decision::Grow { reason, .. } => reason,
        Decision::Keep => "",
    }
}

/// A roomy v2 cgroup: no pressure, no growth cap below a few GiB.
fn calm() -> Sample {
    v2(300 * MIB, Some(8 * GIB), None, (0, 0, 0))
}

#[test]
fn inactive_page_cache_counts_as_room() {
    // 1000 MiB used of 1 GiB, but 300 MiB of it is inactive page cache the kernel reclaims
    // first: 324 MiB of headroom, no pressure, and room to grow.
    let mut s = v2(1000 * MIB, Some(GIB), None, (0, 0, 0));
    if let Some(cg) = s.cgroup.as_mut() {
        cg.inactive_file = 300 * MIB;
    }
    let mut p = Policy::new(PolicyConfig::default());
    assert_eq!(p.decide(&s, 512 * MIB, 400 * MIB, 2 * GIB), Decision::Keep);
    assert!(p.pressure().is_none());
}

#[test]
fn shrinks_by_the_headroom_deficit() {
    let mut p = Policy::new(PolicyConfig::default());
    // limit 1 GiB: watermark max(64 MiB, 51 MiB); headroom 24 MiB; need 2*64-24 = 104 MiB.
    let s = v2(1000 * MIB, Some(GIB), None, (0, 0, 0));
    let d = p.decide(&s, 512 * MIB, 400 * MIB, 2 * GIB);
    assert_eq!(shrink_to(&d), 296 * MIB);
    assert!(
        reason(&d).contains("cgroup headroom 24 MiB < 64 MiB watermark"),
        "{d:?}"
    );
    // memory.high below memory.max is the limit that counts.
    let s = v2(790 * MIB, Some(GIB), Some(800 * MIB), (0, 0, 0));
    let d = Policy::new(PolicyConfig::default()).decide(&s, GIB, 300 * MIB, GIB);
    assert_eq!(
        shrink_to(&d),
        (300 - 118) * MIB,
        "need 2*64-10 beats a quarter"
    );
    assert!(
        reason(&d).contains("headroom 10 MiB < 64 MiB watermark (usage 790 MiB of limit 800 MiB"),
        "{d:?}"
    );
    // A large limit scales the watermark: 5% of 4 GiB = 204.8 MiB.
    let s = v2(4 * GIB - 100 * MIB, Some(4 * GIB), None, (0, 0, 0));
    let d = Policy::new(PolicyConfig::default()).decide(&s, 2 * GIB, 2 * GIB, 2 * GIB);
    assert!(reason(&d).contains("< 204 MiB watermark"), "{d:?}");
    // Enough headroom: no pressure.
    let s = v2(800 * MIB, Some(GIB), None, (0, 0, 0));
    let mut p = Policy::new(PolicyConfig::default());
    assert_eq!(p.decide(&s, GIB, GIB, GIB), Decision::Keep);
    assert_eq!(p.pressure(), None);
}

#[test]
fn shrinks_at_least_a_quarter() {
    let mut p = Policy::new(PolicyConfig::default());
    let d = p.decide(&fired(calm()), 512 * MIB, 400 * MIB, GIB);
    assert_eq!(shrink_to(&d), 300 * MIB, "a quarter of min(budget, used)");
    assert!(reason(&d).starts_with("host PSI trigger fired"), "{d:?}");
    assert_eq!(p.pressure(), Some("host PSI trigger fired"));
    let mut s = calm();
    s.triggers.cgroup_psi = true;
    let d = p.decide(&s, 300 * MIB, 300 * MIB, GIB);
    assert_eq!(shrink_to(&d), 225 * MIB);
    assert!(reason(&d).contains("cgroup memory.pressure trigger fired"));
}

#[test]
fn event_counts_that_grew_are_pressure() {
    let mut p = Policy::new(PolicyConfig::default());
    // The first sample is the baseline: counts since the cgroup was created are history.
    let d = p.decide(&v2(0, None, None, (5, 2, 0)), GIB, GIB, GIB);
    assert_eq!(d, Decision::Keep);
    let d = p.decide(&v2(0, None, None, (5, 5, 0)), GIB, GIB, GIB);
    assert_eq!(shrink_to(&d), 768 * MIB);
    assert!(reason(&d).starts_with("v2 memory.events max +3"), "{d:?}");
    let d = p.decide(&v2(0, None, None, (9, 5, 1)), GIB, GIB, GIB);
    assert!(
        reason(&d).starts_with("v2 memory.events high +4; v2 memory.events oom +1"),
        "{d:?}"
    );
    // Counters that went down (a new cgroup) are no pressure.
    let d = p.decide(&v2(0, None, None, (0, 0, 0)), GIB, GIB, GIB);
    assert_eq!((d, p.pressure()), (Decision::Keep, None));
    // Limit hits of a cgroup full of inactive page cache are reclaim, not pressure...
    let full_of_cache = |events| {
        let mut s = v2(GIB, Some(GIB), None, events);
        s.cgroup.as_mut().unwrap().inactive_file = 600 * MIB;
        s
    };
    let mut p = Policy::new(PolicyConfig::default());
    p.decide(&full_of_cache((0, 10, 0)), 256 * MIB, 256 * MIB, GIB);
    let d = p.decide(&full_of_cache((0, 90, 0)), 256 * MIB, 256 * MIB, GIB);
    assert_eq!((d, p.pressure()), (Decision::Keep, None));
    // ...but an OOM event still is.
    let d = p.decide(&full_of_cache((0, 95, 1)), 256 * MIB, 256 * MIB, GIB);
    assert!(reason(&d).contains("oom +1"), "{d:?}");
}

#[test]
fn psi_averages_shrink_then_cool_down() {
    let mut p = Policy::new(PolicyConfig::default());
    let mut s = calm();
    s.host_psi = psi(12.3);
    let d = p.decide(&s, GIB, GIB, GIB);
    assert_eq!(shrink_to(&d), 768 * MIB);
    assert!(
        reason(&d).starts_with("host PSI some avg10 12.3% > 10%"),
        "{d:?}"
    );
    // avg10 lags: the same reading for the next 3 ticks is pressure but no new shrink.
    for _ in 0..3 {
        assert_eq!(p.decide(&s, 768 * MIB, 768 * MIB, GIB), Decision::Keep);
        assert!(p.pressure().is_some());
    }
    assert_eq!(
        shrink_to(&p.decide(&s, 768 * MIB, 768 * MIB, GIB)),
        576 * MIB
    );
    // An event during the cooldown shrinks at once.
    let d = p.decide(&fired(s.clone()), 576 * MIB, 576 * MIB, GIB);
    assert_eq!(shrink_to(&d), 432 * MIB);
    // The cgroup's own PSI (v2 memory.pressure) counts too.
    let mut s = calm();
    s.cgroup_psi = psi(50.0);
    let d = Policy::new(PolicyConfig::default()).decide(&s, GIB, GIB, GIB);
    assert!(
        reason(&d).starts_with("cgroup PSI some avg10 50.0% > 10%"),
        "{d:?}"
    );
    s.cgroup_psi = psi(9.9);
    assert_eq!(
        Policy::new(PolicyConfig::default()).decide(&s, GIB, GIB, GIB),
        Decision::Keep
    );
}

#[test]
fn low_mem_available_is_pressure() {
    let mut p = Policy::new(PolicyConfig::default());
    let s = Sample {
        meminfo: Some(MemInfo {
            total: 16 * GIB,
            available: 200 * MIB,
        }),
        ..Sample::default()
    };
    // Watermark 5% of 16 GiB = 819.2 MiB; need 2 * 819.2 - 200 = 1438.4 MiB.
    let d = p.decide(&s, 2 * GIB, 2 * GIB, 4 * GIB);
    let need = 2 * (16 * GIB / 100 * 5) - 200 * MIB;
    assert_eq!(shrink_to(&d), 2 * GIB - need);
    assert!(
        reason(&d).starts_with("MemAvailable 200 MiB < 819 MiB watermark"),
        "{d:?}"
    );
}

#[test]
fn lowered_ceiling_shrinks_at_once() {
    let mut p = Policy::new(PolicyConfig::default());
    let d = p.decide(&calm(), 512 * MIB, 100 * MIB, 256 * MIB);
    assert_eq!(shrink_to(&d), 256 * MIB);
    assert!(reason(&d).starts_with("ceiling lowered by operator to 256 MiB"));
    // With pressure as well, the pressure target wins when it is lower.
    let d = p.decide(&fired(calm()), 512 * MIB, 200 * MIB, 256 * MIB);
    assert_eq!(shrink_to(&d), 150 * MIB);
    // Pressure with nothing left to cut still obeys the ceiling.
    let d = p.decide(&fired(calm()), 512 * MIB, 10 * MIB, 256 * MIB);
    assert_eq!(shrink_to(&d), 32 * MIB);
}

#[test]
fn floor_is_respected() {
    let mut p = Policy::new(PolicyConfig::default());
    let d = p.decide(&fired(calm()), 256 * MIB, 40 * MIB, GIB);
    assert_eq!(shrink_to(&d), 32 * MIB);
    assert_eq!(
        p.decide(&fired(calm()), 32 * MIB, 32 * MIB, GIB),
        Decision::Keep
    );
    assert!(p.pressure().is_some());
    // An operator ceiling below the floor wins over the floor.
    let d = p.decide(&fired(calm()), 64 * MIB, 64 * MIB, 16 * MIB);
    assert_eq!(shrink_to(&d), 16 * MIB);
    assert_eq!(
        p.decide(&fired(calm()), 16 * MIB, 16 * MIB, 16 * MIB),
        Decision::Keep
    );
}

#[test]
fn v2_sequence_with_hysteresis() {
    let mut p = Policy::new(PolicyConfig::default());
    let ceiling = GIB;
    let tight = v2(1000 * MIB, Some(GIB), None, (0, 0, 0));
    // Pressure: shrink.
    let mut budget = shrink_to(&p.decide(&tight, ceiling, ceiling, ceiling));
    assert_eq!(budget, 768 * MIB, "a quarter beats the 104 MiB need");
    // Calm for 9 ticks: keep; the 10th grows by max(64 MiB, ceiling / 8) = 128 MiB.
    for _ in 0..9 {
        assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
    }
    let d = p.decide(&calm(), budget, budget, ceiling);
    assert_eq!(grow_to(&d), budget + 128 * MIB);
    assert!(reason(&d).starts_with("calm for 10 ticks"), "{d:?}");
    budget += 128 * MIB;
    // The next step needs another calm period.
    for _ in 0..9 {
        assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
    }
    budget = grow_to(&p.decide(&calm(), budget, budget, ceiling));
    assert_eq!(budget, 1024 * MIB, "the step stops at the ceiling");
    for _ in 0..20 {
        assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
    }
    // Pressure again: shrink, and the calm period restarts.
    budget = shrink_to(&p.decide(&tight, budget, budget, ceiling));
    assert_eq!(budget, 768 * MIB);
    for _ in 0..9 {
        assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
    }
    // Pressure on the 10th tick resets the count once more.
    assert_eq!(
        shrink_to(&p.decide(&fired(calm()), budget, budget, ceiling)),
        576 * MIB
    );
    budget = 576 * MIB;
    for _ in 0..9 {
        assert_eq!(p.decide(&calm(), budget, budget, ceiling), Decision::Keep);
    }
    assert_eq!(
        grow_to(&p.decide(&calm(), budget, budget, ceiling)),
        704 * MIB
    );
}

#[test]
fn growth_stays_out_of_the_limit() {
    let mut p = Policy::new(PolicyConfig::default());
    // limit 1 GiB, watermark 64 MiB, usage 800 MiB: headroom 224 MiB, no pressure.
    let s = v2(800 * MIB, Some(GIB), None, (0, 0, 0));
    for _ in 0..9 {
        assert_eq!(p.decide(&s, 300 * MIB, 300 * MIB, GIB), Decision::Keep);
    }
    // used + headroom - 2 * watermark = 300 + 224 - 128 = 396 MiB < 300 + 128.
    let d = p.decide(&s, 300 * MIB, 300 * MIB, GIB);
    assert_eq!(grow_to(&d), 396 * MIB);
    assert!(reason(&d).contains("capped at 396 MiB"), "{d:?}");
    // At the cap there is nothing to grow.
    let mut p = Policy::new(PolicyConfig::default());
    for _ in 0..30 {
        assert_eq!(p.decide(&s, 396 * MIB, 300 * MIB, GIB), Decision::Keep);
    }
    // MemAvailable caps growth the same way.
    let host = Sample {
        meminfo: Some(MemInfo {
            total: 10 * GIB,
            available: 1200 * MIB,
        }),
        ..Sample::default()
    };
    let mut p = Policy::new(PolicyConfig::default());
    for _ in 0..9 {
        p.decide(&host, 100 * MIB, 100 * MIB, 4 * GIB);
    }
    let wm = 10 * GIB / 100 * 5;
    assert_eq!(
        grow_to(&p.decide(&host, 100 * MIB, 100 * MIB, 4 * GIB)),
        100 * MIB + 1200 * MIB - 2 * wm
    );
}

#[test]
fn raised_ceiling_jumps_when_calm() {
    let mut p = Policy::new(PolicyConfig::default());
    assert_eq!(p.decide(&calm(), GIB, GIB, GIB), Decision::Keep);
    let d = p.decide(&calm(), GIB, GIB, 2 * GIB);
    assert_eq!(grow_to(&d), 2 * GIB);
    assert!(reason(&d).starts_with("ceiling raised by operator to 2048 MiB"));
    // Room caps the jump: limit 3 GiB (watermark 153.6 MiB), usage 2 GiB.
    let mut p = Policy::new(PolicyConfig::default());
    let s = v2(2 * GIB, Some(3 * GIB), None, (0, 0, 0));
    p.decide(&s, GIB, GIB, GIB);
    let cap = GIB + GIB - 2 * (3 * GIB / 100 * 5);
    assert_eq!(grow_to(&p.decide(&s, GIB, GIB, 4 * GIB)), cap);
    // After a recent shrink a raise waits for the calm period like any growth.
    let mut p = Policy::new(PolicyConfig::default());
    let budget = shrink_to(&p.decide(&fired(calm()), GIB, GIB, GIB));
    assert_eq!(p.decide(&calm(), budget, budget, 2 * GIB), Decision::Keep);
    // Pressure at the moment of the raise: no jump.
    let mut p = Policy::new(PolicyConfig::default());
    p.decide(&calm(), 0, 0, GIB);
    let mut s = calm();
    s.host_psi = psi(20.0);
    assert!(matches!(
        p.decide(&s, GIB, GIB, 2 * GIB),
        Decision::Shrink { .. }
    ));
}

#[test]
fn v1_sequence() {
    let mut p = Policy::new(PolicyConfig::default());
    let limit = 256 * MIB;
    let ceiling = 512 * MIB;
    // A hog grows in a 256 MiB v1 cgroup: fine at 120 MiB.
    assert_eq!(
        p.decide(&v1(120 * MIB, limit, 0, 0), ceiling, 200 * MIB, ceiling),
        Decision::Keep
    );
    // At 210 MiB headroom is 46 MiB < 64 MiB: shrink by max(2*64-46, 200/4) = 82 MiB.
    let d = p.decide(&v1(210 * MIB, limit, 0, 0), ceiling, 200 * MIB, ceiling);
    assert_eq!(shrink_to(&d), 118 * MIB);
    assert!(reason(&d).starts_with("cgroup headroom 46 MiB < 64 MiB watermark"));
    // Limit hits (failcnt) and OOM kills, v1 names in the reason.
    let d = p.decide(&v1(100 * MIB, limit, 4, 1), 118 * MIB, 118 * MIB, ceiling);
    assert!(
        reason(&d).starts_with("v1 memory.failcnt +4; v1 memory.oom_control oom_kill +1"),
        "{d:?}"
    );
    let mut s = v1(100 * MIB, limit, 4, 1);
    s.triggers.v1_pressure_level = true;
    let d = p.decide(&s, 89 * MIB, 89 * MIB, ceiling);
    assert!(reason(&d).starts_with("v1 memory.pressure_level medium event"));
    let budget = shrink_to(&d);
    // Calm: growth is capped by the limit: used + 156 - 128.
    let s = v1(100 * MIB, limit, 4, 1);
    for _ in 0..9 {
        assert_eq!(p.decide(&s, budget, budget, ceiling), Decision::Keep);
    }
    assert_eq!(
        grow_to(&p.decide(&s, budget, budget, ceiling)),
        budget + 28 * MIB
    );
}
