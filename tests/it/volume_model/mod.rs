//! Model-based test of the filesystem: random operation sequences run against a real [`Volume`]
//! (a real tenant store under /var/tmp) and against a small in-memory reference model. After
//! every step the two must agree on return values, errnos, sizes, file contents, directory
//! listings, link counts, symlink targets and xattrs. A reopen step closes the store and opens it
//! again mid-sequence: everything must persist, and files unlinked while open must be gone.
//!
//! The model follows Linux (rename(2), link(2), unlink(2), rmdir(2), fallocate(2)), including
//! the order in which the kernel reports errors when several apply. SEEK_DATA/SEEK_HOLE are
//! checked loosely: the volume may report zeros as data, never data as a hole.
//!
//! `PROPTEST_CASES=n` runs more (or fewer) cases per profile.

use crate::common;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

use crate::generators::{fallocate_mode, fill, length, offset, rename_mode, xattr_mode, Fill, BS};
use common::{noise, TestHost};
use tenantfs::store::DirectIo;
use tenantfs::tenants;
use tenantfs::volume::{
    Attr, Fallocate, FileKind, Owner, RenameMode, SetAttr, Volume, XattrMode, ROOT_INO,
};

const OWNER: Owner = Owner {
    uid: 1000,
    gid: 100,
};

type R<T> = Result<T, i32>;

mod cases;
mod crash;
mod harness;
mod model;
mod ops;

use harness::*;
use model::*;
use ops::*;

fn run_case(host: &TestHost, ops: &[Op], stats: &Stats) {
    let mut h = Harness::new(host, stats);
    h.check_all();
    for (i, op) in ops.iter().enumerate() {
        h.ctx = format!("step {i} {op:?}");
        h.step(op);
        h.check_all();
    }
    // A last reopen: everything must have persisted.
    h.ctx = "final reopen".into();
    h.reopen();
    h.check_all();
    h.finish();
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Silences the panic message of this thread's panics (the runner reports failures itself).
fn quiet_panics(quiet: bool) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                default(info)
            }
        }));
    });
    QUIET.with(|q| q.set(quiet));
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Cases per profile unless `PROPTEST_CASES` says otherwise (each is up to 80 operations).
const DEFAULT_CASES: u32 = 128;

/// With the default number of cases or more, every interesting outcome must have come up.
fn expect_seen(stats: &BTreeMap<String, u64>, keys: &[&str]) {
    if cases() >= DEFAULT_CASES {
        for key in keys {
            assert!(stats.contains_key(*key), "never saw {key}");
        }
    }
}

fn run_profile(profile: Profile, setup: Vec<Op>) -> BTreeMap<String, u64> {
    let host = TestHost::new(DirectIo::Auto);
    let stats = Stats::default();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..Config::default()
    });
    let strategy = prop::collection::vec(op(profile), 1..80).prop_map(move |ops| {
        let mut all = setup.clone();
        all.extend(ops);
        all
    });
    // Failing cases are reported once, shrunk, by the runner: keep the panics it catches quiet.
    quiet_panics(true);
    let result = runner.run(&strategy, |ops| {
        run_case(&host, &ops, &stats);
        Ok(())
    });
    quiet_panics(false);
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, ops)) => {
            let steps: Vec<String> = ops
                .iter()
                .enumerate()
                .map(|(i, op)| format!("  {i:2}: {op:?}"))
                .collect();
            panic!("{reason}\nminimal failing sequence:\n{}", steps.join("\n"))
        }
        Err(e) => panic!("{e}"),
    }
    let stats = stats.into_inner();
    for (k, v) in &stats {
        eprintln!("{v:6}  {k}");
    }
    stats
}

fn root_pick() -> Pick {
    // The live directories are listed by inode number: the root comes first.
    Pick {
        wide: false,
        idx: 0,
    }
}

/// Renames, links, removals and their errors, over a few nested directories.
#[test]
fn namespace_ops_match_the_model() {
    let stats = run_profile(
        Profile {
            namespace: 3,
            data: 1,
            xattr: 2,
        },
        Vec::new(),
    );
    expect_seen(
        &stats,
        &[
            "rename Replace -> ok",
            "rename Replace -> EINVAL",
            "rename Replace -> ENOTEMPTY",
            "rename Replace -> EISDIR",
            "rename Replace -> ENOTDIR",
            "rename NoReplace -> EEXIST",
            "rename Exchange -> ok",
            "rename Exchange -> EINVAL",
            "rename (same inode) Replace -> ok",
            "rmdir -> ok",
            "rmdir -> ENOTEMPTY",
            "link -> ok",
            "link -> EPERM",
            "unlink -> ok",
            "forget -> freed",
            "reopen -> ok",
            "setxattr Create -> EEXIST",
            "getxattr -> ok",
        ],
    );
}

/// Writes, reads, truncation, fallocate and seeks on a few files.
#[test]
fn data_ops_match_the_model() {
    let file = |name| Op::Create {
        dir: root_pick(),
        name,
        kind: NewKind::File,
    };
    let stats = run_profile(
        Profile {
            namespace: 1,
            data: 6,
            xattr: 2,
        },
        vec![file(0), file(1)],
    );
    expect_seen(
        &stats,
        &[
            "write -> ok",
            "read -> ok",
            "truncate -> ok",
            "fallocate PunchHole -> ok",
            "fallocate ZeroRange { keep_size: false } -> ok",
            "fallocate Allocate { keep_size: false } -> ok",
            "seek_data -> ok",
            "seek_hole -> hole",
            "reopen -> ok",
        ],
    );
}

fn open_volume(t: &TestHost, name: &str) -> Volume {
    if !tenants::list(&t.root)
        .unwrap()
        .iter()
        .any(|i| i.name == name)
    {
        tenants::create(&t.data, &t.host, name, Some(BS)).unwrap();
    }
    Volume::open(tenants::open(&t.data, &t.host, name).unwrap()).unwrap()
}
