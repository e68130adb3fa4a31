//! One set of proptest generators for the reference tests: the volume model
//! (`volume_model`), the FUSE model (`fuse_model`) and the long random runs against a mount
//! (`fuse_mount`) draw offsets, lengths, contents and modes from the same strategies, and the
//! long runs draw their whole sequence of steps from one seeded runner instead of an RNG of
//! their own.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tenantfs::volume::{Fallocate, RenameMode, XattrMode};

use crate::common::noise;

/// The block size of the tenants these tests create.
pub const BS: u64 = 4096;

/// What a write writes.
#[derive(Clone, Copy, Debug)]
pub enum Fill {
    Noise(u64),
    Zeros,
    /// Zeros with a few non-zero bytes.
    Sparse(u64),
    /// Noise, then zeros from a point on.
    NoiseThenZeros(u64, u16),
}

impl Fill {
    /// `len` bytes of this fill.
    pub fn bytes(self, len: usize) -> Vec<u8> {
        match self {
            Fill::Noise(s) => noise(s, len),
            Fill::Zeros => vec![0; len],
            Fill::Sparse(s) => {
                let mut v = vec![0; len];
                if len > 0 {
                    let r = noise(s, 12);
                    for k in 0..4 {
                        let pos = u16::from_le_bytes([r[2 * k], r[2 * k + 1]]) as usize * 13 % len;
                        v[pos] = r[8 + k] | 1;
                    }
                }
                v
            }
            Fill::NoiseThenZeros(s, cut) => {
                let mut v = noise(s, len);
                let cut = usize::from(cut).min(len);
                v[cut..].fill(0);
                v
            }
        }
    }
}

/// Offsets within ~40 KB, biased to block boundaries and their neighbours; some on 64 KiB
/// chunk boundaries and some further out, where bulk writes leave chunks for small writes,
/// truncation and holes to cut into.
pub fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..40_000,
        1 => Just(0u64),
        1 => (0u64..10).prop_map(|k| k * BS),
        1 => (1u64..10, 0u64..7).prop_map(|(k, d)| k * BS + d - 3),
        1 => (0u64..5).prop_map(|k| k * 16 * BS),
        1 => 40_000u64..400_000,
    ]
}

pub fn length() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..12_000,
        2 => (1u64..4).prop_map(|k| k * BS),
        2 => 0u64..16,
        2 => Just(0u64),
        // Bulk writes skip the WAL (durable at fsync or a clean close): reopen must keep them.
        1 => (256u64 << 10)..(300 << 10),
    ]
}

pub fn fill() -> impl Strategy<Value = Fill> {
    prop_oneof![
        4 => any::<u64>().prop_map(Fill::Noise),
        1 => Just(Fill::Zeros),
        2 => any::<u64>().prop_map(Fill::Sparse),
        2 => (any::<u64>(), 0u16..12_000).prop_map(|(s, c)| Fill::NoiseThenZeros(s, c)),
    ]
}

pub fn rename_mode() -> impl Strategy<Value = RenameMode> {
    prop_oneof![
        3 => Just(RenameMode::Replace),
        1 => Just(RenameMode::NoReplace),
        2 => Just(RenameMode::Exchange),
    ]
}

pub fn fallocate_mode() -> impl Strategy<Value = Fallocate> {
    prop_oneof![
        any::<bool>().prop_map(|keep_size| Fallocate::Allocate { keep_size }),
        Just(Fallocate::PunchHole),
        any::<bool>().prop_map(|keep_size| Fallocate::ZeroRange { keep_size }),
    ]
}

pub fn xattr_mode() -> impl Strategy<Value = XattrMode> {
    prop_oneof![
        Just(XattrMode::Any),
        Just(XattrMode::Create),
        Just(XattrMode::Replace)
    ]
}

/// `n` values of `strategy` from a runner seeded with `seed`: the same sequence on every run,
/// for long runs that are replayed whole rather than shrunk.
pub fn sequence<S: Strategy>(strategy: S, n: usize, seed: u64) -> Vec<S::Value> {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    proptest::collection::vec(strategy, n)
        .new_tree(&mut runner)
        .expect("a sequence")
        .current()
}

/// A data operation on one of a few files, as a long run against a mount applies it to the
/// mount's file and to a reference file alike.
#[derive(Clone, Debug)]
pub enum DataOp {
    Write {
        file: usize,
        offset: u64,
        data: Fill,
        len: u64,
    },
    Read {
        file: usize,
        offset: u64,
        len: u64,
    },
    Truncate {
        file: usize,
        size: u64,
    },
    Fallocate {
        file: usize,
        offset: u64,
        len: u64,
        mode: Fallocate,
    },
    SyncData {
        file: usize,
    },
    /// Close and open again: what the kernel caches per open file must not matter.
    Reopen {
        file: usize,
    },
}

/// Offsets for long runs: the edge-biased [`offset`]s, and anywhere in `span`.
fn offset_in(span: u64) -> impl Strategy<Value = u64> {
    prop_oneof![1 => offset(), 2 => 0..span]
}

/// Lengths for long runs (never 0: fallocate refuses it): mostly small, a quarter up to
/// 300,000 bytes (bulk writes).
fn data_length() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 1u64..9000, 1 => 1u64..300_000]
}

/// Data operations on `files` files within `span` bytes: half writes, 30% reads, the rest
/// truncation, hole punching, zeroing, syncs and reopens.
pub fn data_op(files: usize, span: u64) -> impl Strategy<Value = DataOp> {
    let file = 0..files;
    prop_oneof![
        50 => (file.clone(), offset_in(span), fill(), data_length())
            .prop_map(|(file, offset, data, len)| DataOp::Write { file, offset, data, len }),
        30 => (file.clone(), offset_in(span), data_length())
            .prop_map(|(file, offset, len)| DataOp::Read { file, offset, len }),
        6 => (file.clone(), offset_in(span)).prop_map(|(file, size)| DataOp::Truncate { file, size }),
        10 => (file.clone(), offset_in(span), data_length(), fallocate_mode())
            .prop_map(|(file, offset, len, mode)| DataOp::Fallocate { file, offset, len, mode }),
        2 => file.clone().prop_map(|file| DataOp::SyncData { file }),
        2 => file.prop_map(|file| DataOp::Reopen { file }),
    ]
}

/// A namespace operation between two of a caller's paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceOp {
    /// Create a new file (`O_EXCL`) with up to 20,000 bytes.
    CreateNew,
    /// Append up to 5,000 bytes to an existing file.
    Append,
    Mkdir,
    Rmdir,
    Unlink,
    Rename(RenameMode),
    Link,
    Symlink,
    Chmod,
    /// Open read-write (and keep it open, for later writes to a file that may be gone).
    Open,
}

/// One step of a long namespace run: an operation from path `p` to path `q` (indexes into the
/// caller's paths), a seed for its contents, and whether to then write to one of the files
/// kept open (`touch_open`: which, modulo how many are open; and whether to close it after).
#[derive(Clone, Debug)]
pub struct NamespaceStep {
    pub op: NamespaceOp,
    pub p: usize,
    pub q: usize,
    pub seed: u64,
    pub touch_open: Option<(usize, bool)>,
}

pub fn namespace_step(paths: usize) -> impl Strategy<Value = NamespaceStep> {
    let op = prop_oneof![
        1 => Just(NamespaceOp::CreateNew),
        1 => Just(NamespaceOp::Append),
        1 => Just(NamespaceOp::Mkdir),
        1 => Just(NamespaceOp::Rmdir),
        1 => Just(NamespaceOp::Unlink),
        2 => Just(NamespaceOp::Rename(RenameMode::Replace)),
        1 => Just(NamespaceOp::Rename(RenameMode::NoReplace)),
        1 => Just(NamespaceOp::Rename(RenameMode::Exchange)),
        1 => Just(NamespaceOp::Link),
        1 => Just(NamespaceOp::Symlink),
        1 => Just(NamespaceOp::Chmod),
        1 => Just(NamespaceOp::Open),
    ];
    let touch = prop_oneof![9 => Just(None), 1 => (any::<usize>(), prop::bool::weighted(1.0 / 3.0)).prop_map(Some)];
    (op, 0..paths, 0..paths, any::<u64>(), touch).prop_map(|(op, p, q, seed, touch_open)| {
        NamespaceStep {
            op,
            p,
            q,
            seed,
            touch_open,
        }
    })
}
