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

/// The smallest block size a tenant takes: file offsets up to ~52 KiB span a dozen blocks.
const OWNER: Owner = Owner {
    uid: 1000,
    gid: 100,
};

type R<T> = Result<T, i32>;

// ---------------------------------------------------------------------------------------------
// Names and values the operations draw from: few, so that they collide.

/// Entry names: four short ones, the longest allowed and one too long.
fn entry_name(i: usize) -> Vec<u8> {
    match i {
        0..=3 => vec![b'a' + i as u8],
        4 => vec![b'm'; 255],
        _ => vec![b'n'; 256],
    }
}

/// Symlink targets: short ones, the longest allowed, one too long, and the empty one.
fn link_target(i: usize) -> Vec<u8> {
    match i {
        0 => b"a".to_vec(),
        1 => b"../b/c".to_vec(),
        2 => vec![b't'; 4095],
        3 => vec![b't'; 4096],
        _ => Vec::new(),
    }
}

fn xattr_name(i: usize) -> Vec<u8> {
    format!("user.{}", ["a", "b", "c"][i % 3]).into_bytes()
}

// ---------------------------------------------------------------------------------------------
// The reference model.

#[derive(Clone, Debug)]
enum Body {
    File(Vec<u8>),
    Dir {
        entries: BTreeMap<Vec<u8>, u64>,
        parent: u64,
    },
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Node {
    body: Body,
    /// Directory entries naming the node (for a directory: 1 while linked, 0 once removed).
    links: u32,
    perm: u16,
    uid: u32,
    gid: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Node {
    fn new(body: Body, perm: u16) -> Self {
        Node {
            body,
            links: 1,
            perm,
            uid: OWNER.uid,
            gid: OWNER.gid,
            xattrs: BTreeMap::new(),
        }
    }

    fn kind(&self) -> FileKind {
        match self.body {
            Body::File(_) => FileKind::File,
            Body::Dir { .. } => FileKind::Dir,
            Body::Symlink(_) => FileKind::Symlink,
        }
    }

    fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir { .. })
    }
}

/// Every inode the test may still name: linked ones, orphans (no links, still "open"), and
/// inodes freed by forget in this session (their numbers are not reused before a reopen).
struct Model {
    nodes: BTreeMap<u64, Node>,
    forgotten: BTreeMap<u64, FileKind>,
}

impl Model {
    fn new() -> Self {
        let mut root = Node::new(
            Body::Dir {
                entries: BTreeMap::new(),
                parent: ROOT_INO,
            },
            0o755,
        );
        root.uid = 0;
        root.gid = 0;
        Model {
            nodes: BTreeMap::from([(ROOT_INO, root)]),
            forgotten: BTreeMap::new(),
        }
    }

    fn node(&self, ino: u64) -> R<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> &mut Node {
        self.nodes.get_mut(&ino).expect("model node")
    }

    fn entries(&self, dir: u64) -> R<&BTreeMap<Vec<u8>, u64>> {
        match &self.node(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.node_mut(dir).body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    /// A directory that can take new entries (a removed one cannot: ENOENT).
    fn live_dir(&self, dir: u64) -> R<&BTreeMap<Vec<u8>, u64>> {
        let entries = self.entries(dir)?;
        if self.nodes[&dir].links == 0 {
            return Err(libc::ENOENT);
        }
        Ok(entries)
    }

    fn parent_of(&self, dir: u64) -> u64 {
        match self.nodes[&dir].body {
            Body::Dir { parent, .. } => parent,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    fn set_parent(&mut self, dir: u64, new: u64) {
        if let Body::Dir { parent, .. } = &mut self.node_mut(dir).body {
            *parent = new;
        }
    }

    fn nlink(&self, ino: u64) -> u32 {
        let n = &self.nodes[&ino];
        match &n.body {
            Body::Dir { entries, .. } if n.links > 0 => {
                2 + entries.values().filter(|c| self.nodes[c].is_dir()).count() as u32
            }
            _ => n.links,
        }
    }

    fn size(&self, ino: u64) -> u64 {
        match &self.nodes[&ino].body {
            Body::File(d) => d.len() as u64,
            Body::Dir { .. } => 0,
            Body::Symlink(t) => t.len() as u64,
        }
    }

    /// Whether directory `dir` is `ancestor` or lies below it.
    fn is_within(&self, dir: u64, ancestor: u64) -> bool {
        let mut cur = dir;
        loop {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT_INO {
                return false;
            }
            cur = self.parent_of(cur);
        }
    }

    fn check_name(name: &[u8]) -> R<()> {
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        Ok(())
    }

    /// Whether `name` can be created in `parent` (mknod, mkdir, symlink).
    fn check_create(&self, parent: u64, name: &[u8]) -> R<()> {
        Self::check_name(name)?;
        if self.live_dir(parent)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    fn add(&mut self, parent: u64, name: &[u8], ino: u64, node: Node) {
        self.nodes.insert(ino, node);
        self.entries_mut(parent).insert(name.to_vec(), ino);
    }

    fn drop_link(&mut self, ino: u64) {
        let n = self.node_mut(ino);
        n.links = if n.is_dir() { 0 } else { n.links - 1 };
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> R<u64> {
        Self::check_name(name)?;
        self.entries(parent)?.get(name).copied().ok_or(libc::ENOENT)
    }

    fn remove(&mut self, parent: u64, name: &[u8], dir: bool) -> R<()> {
        Self::check_name(name)?;
        let child = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        let c = &self.nodes[&child];
        match (dir, c.is_dir()) {
            (false, true) => return Err(libc::EISDIR),
            (true, false) => return Err(libc::ENOTDIR),
            (true, true) if !self.entries(child)?.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.entries_mut(parent).remove(name);
        self.drop_link(child);
        Ok(())
    }

    fn link(&mut self, ino: u64, newparent: u64, newname: &[u8]) -> R<()> {
        Self::check_name(newname)?;
        if self.live_dir(newparent)?.contains_key(newname) {
            return Err(libc::EEXIST);
        }
        let n = self.node(ino)?;
        if n.is_dir() {
            return Err(libc::EPERM);
        }
        if n.links == 0 {
            return Err(libc::ENOENT);
        }
        self.node_mut(ino).links += 1;
        self.entries_mut(newparent).insert(newname.to_vec(), ino);
        Ok(())
    }

    /// rename(2) / renameat2(2), checks in the kernel's order.
    fn rename(
        &mut self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        mode: RenameMode,
    ) -> R<()> {
        Self::check_name(name)?;
        Self::check_name(newname)?;
        let src = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        let dst = self.live_dir(newparent)?.get(newname).copied();
        if mode == RenameMode::NoReplace && dst.is_some() {
            return Err(libc::EEXIST);
        }
        if mode == RenameMode::Exchange && dst.is_none() {
            return Err(libc::ENOENT);
        }
        let src_dir = self.nodes[&src].is_dir();
        let dst_dir = dst.is_some_and(|d| self.nodes[&d].is_dir());
        // The source must not be an ancestor of the target...
        if src_dir && parent != newparent && self.is_within(newparent, src) {
            return Err(libc::EINVAL);
        }
        // ... nor the target an ancestor of the source.
        if let Some(d) = dst {
            if dst_dir && parent != newparent && self.is_within(parent, d) {
                return Err(if mode == RenameMode::Exchange {
                    libc::EINVAL
                } else {
                    libc::ENOTEMPTY
                });
            }
        }
        if dst == Some(src) {
            return Ok(()); // two links to one inode: nothing happens
        }
        if mode == RenameMode::Exchange {
            let d = dst.unwrap();
            self.entries_mut(parent).insert(name.to_vec(), d);
            self.entries_mut(newparent).insert(newname.to_vec(), src);
            if src_dir {
                self.set_parent(src, newparent);
            }
            if dst_dir {
                self.set_parent(d, parent);
            }
            return Ok(());
        }
        if let Some(d) = dst {
            match (src_dir, dst_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.entries(d)?.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            self.drop_link(d);
        }
        self.entries_mut(parent).remove(name);
        self.entries_mut(newparent).insert(newname.to_vec(), src);
        if src_dir {
            self.set_parent(src, newparent);
        }
        Ok(())
    }

    fn file_mut(&mut self, ino: u64, symlink_err: i32) -> R<&mut Vec<u8>> {
        match &mut self.nodes.get_mut(&ino).ok_or(libc::ENOENT)?.body {
            Body::File(d) => Ok(d),
            Body::Dir { .. } => Err(libc::EISDIR),
            Body::Symlink(_) => Err(symlink_err),
        }
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> R<u32> {
        let file = self.file_mut(ino, libc::EINVAL)?;
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset as usize + data.len();
        if file.len() < end {
            file.resize(end, 0);
        }
        file[offset as usize..end].copy_from_slice(data);
        Ok(data.len() as u32)
    }

    fn read(&mut self, ino: u64, offset: u64, len: u32) -> R<Vec<u8>> {
        let file = self.file_mut(ino, libc::EINVAL)?;
        let start = (offset as usize).min(file.len());
        let end = (offset as usize + len as usize).min(file.len());
        Ok(file[start..end].to_vec())
    }

    fn truncate(&mut self, ino: u64, size: u64) -> R<()> {
        self.file_mut(ino, libc::EINVAL)?.resize(size as usize, 0);
        Ok(())
    }

    fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: Fallocate) -> R<()> {
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let file = self.file_mut(ino, libc::EOPNOTSUPP)?;
        let end = (offset + len) as usize;
        let zero_end = end.min(file.len());
        let grow = match mode {
            Fallocate::Allocate { keep_size } => !keep_size,
            Fallocate::PunchHole => false,
            Fallocate::ZeroRange { keep_size } => !keep_size,
        };
        if !matches!(mode, Fallocate::Allocate { .. }) && (offset as usize) < zero_end {
            file[offset as usize..zero_end].fill(0);
        }
        if grow && end > file.len() {
            file.resize(end, 0);
        }
        Ok(())
    }

    fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(libc::EINVAL),
        }
    }

    fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> R<()> {
        let xattrs = &mut self.nodes.get_mut(&ino).ok_or(libc::ENOENT)?.xattrs;
        match (mode, xattrs.contains_key(name)) {
            (XattrMode::Create, true) => return Err(libc::EEXIST),
            (XattrMode::Replace, false) => return Err(libc::ENODATA),
            _ => {}
        }
        xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> R<Vec<u8>> {
        self.node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(libc::ENODATA)
    }

    fn removexattr(&mut self, ino: u64, name: &[u8]) -> R<()> {
        let xattrs = &mut self.nodes.get_mut(&ino).ok_or(libc::ENOENT)?.xattrs;
        xattrs.remove(name).map(|_| ()).ok_or(libc::ENODATA)
    }

    fn listxattr(&self, ino: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for name in self.nodes[&ino].xattrs.keys() {
            out.extend_from_slice(name);
            out.push(0);
        }
        out
    }

    /// The kernel dropped its last reference: an inode without links is freed.
    fn forget(&mut self, ino: u64) {
        if self.nodes.contains_key(&ino) && self.nlink(ino) == 0 {
            let n = self.nodes.remove(&ino).unwrap();
            self.forgotten.insert(ino, n.kind());
        }
    }

    /// A new session: every orphan is gone, inode numbers may be reused.
    fn reopen(&mut self) -> Vec<u64> {
        let orphans: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|&i| self.nlink(i) == 0)
            .collect();
        for o in &orphans {
            self.nodes.remove(o);
        }
        self.forgotten.clear();
        orphans
    }
}

// ---------------------------------------------------------------------------------------------
// Operations.

/// Picks an inode at run time: an index into a list of candidates; `wide` widens the list to
/// removed and forgotten inodes, so that operations on stale handles are exercised too.
#[derive(Clone, Copy, Debug)]
struct Pick {
    wide: bool,
    idx: usize,
}

/// A directory entry: an existing one (any directory, `dir.idx` chooses) or a name from the
/// pool in a picked directory.
#[derive(Clone, Copy, Debug)]
struct Loc {
    existing: bool,
    dir: Pick,
    name: usize,
}

#[derive(Clone, Copy, Debug)]
enum NewKind {
    File,
    Dir,
    Symlink(usize),
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        dir: Pick,
        name: usize,
        kind: NewKind,
    },
    Lookup {
        at: Loc,
    },
    Unlink {
        at: Loc,
    },
    Rmdir {
        at: Loc,
    },
    Rename {
        from: Loc,
        to: Loc,
        mode: RenameMode,
    },
    Link {
        node: Pick,
        to: Loc,
    },
    Readlink {
        node: Pick,
    },
    Write {
        node: Pick,
        offset: u64,
        len: u64,
        fill: Fill,
    },
    Read {
        node: Pick,
        offset: u64,
        len: u32,
    },
    Truncate {
        node: Pick,
        size: u64,
    },
    Fallocate {
        node: Pick,
        offset: u64,
        len: u64,
        mode: Fallocate,
    },
    SeekData {
        node: Pick,
        offset: u64,
    },
    SeekHole {
        node: Pick,
        offset: u64,
    },
    SetXattr {
        node: Pick,
        name: usize,
        value: Vec<u8>,
        mode: XattrMode,
    },
    GetXattr {
        node: Pick,
        name: usize,
    },
    RemoveXattr {
        node: Pick,
        name: usize,
    },
    Forget {
        node: Pick,
    },
    Reopen,
}

fn pick() -> impl Strategy<Value = Pick> {
    (prop::bool::weighted(0.1), 0usize..64).prop_map(|(wide, idx)| Pick { wide, idx })
}

/// Mostly the first few inodes, so that xattr operations meet each other's attributes.
fn xattr_pick() -> impl Strategy<Value = Pick> {
    (prop::bool::weighted(0.05), 0usize..2).prop_map(|(wide, idx)| Pick { wide, idx })
}

fn loc() -> impl Strategy<Value = Loc> {
    (prop::bool::weighted(0.5), pick(), name_idx()).prop_map(|(existing, dir, name)| Loc {
        existing,
        dir,
        name,
    })
}

fn name_idx() -> impl Strategy<Value = usize> {
    prop_oneof![30 => 0usize..4, 1 => Just(4usize), 1 => Just(5usize)]
}

/// Relative weights of the operation groups.
#[derive(Clone, Copy)]
struct Profile {
    namespace: u32,
    data: u32,
    xattr: u32,
}

fn op(p: Profile) -> BoxedStrategy<Op> {
    let ns = p.namespace;
    let data = p.data;
    let kind = prop_oneof![
        3 => Just(NewKind::File),
        2 => Just(NewKind::Dir),
        1 => prop_oneof![8 => 0usize..2, 1 => Just(2usize), 1 => Just(3usize), 1 => Just(4usize)]
            .prop_map(NewKind::Symlink),
    ];
    prop_oneof![
        3 * ns => (pick(), name_idx(), kind).prop_map(|(dir, name, kind)| Op::Create { dir, name, kind }),
        ns => loc().prop_map(|at| Op::Lookup { at }),
        ns => loc().prop_map(|at| Op::Unlink { at }),
        ns => loc().prop_map(|at| Op::Rmdir { at }),
        3 * ns => (loc(), loc(), rename_mode()).prop_map(|(from, to, mode)| Op::Rename { from, to, mode }),
        ns => (pick(), loc()).prop_map(|(node, to)| Op::Link { node, to }),
        1 => pick().prop_map(|node| Op::Readlink { node }),
        3 * data => (pick(), offset(), length(), fill())
            .prop_map(|(node, offset, len, fill)| Op::Write { node, offset, len, fill }),
        2 * data => (pick(), offset(), length())
            .prop_map(|(node, offset, len)| Op::Read { node, offset, len: len as u32 }),
        data => (pick(), offset()).prop_map(|(node, size)| Op::Truncate { node, size }),
        2 * data => (pick(), offset(), length(), fallocate_mode())
            .prop_map(|(node, offset, len, mode)| Op::Fallocate { node, offset, len, mode }),
        data => (pick(), offset()).prop_map(|(node, offset)| Op::SeekData { node, offset }),
        data => (pick(), offset()).prop_map(|(node, offset)| Op::SeekHole { node, offset }),
        2 * p.xattr => (xattr_pick(), 0usize..2, prop::collection::vec(any::<u8>(), 0..40), xattr_mode())
            .prop_map(|(node, name, value, mode)| Op::SetXattr { node, name, value, mode }),
        p.xattr => (xattr_pick(), 0usize..2).prop_map(|(node, name)| Op::GetXattr { node, name }),
        p.xattr => (xattr_pick(), 0usize..3).prop_map(|(node, name)| Op::RemoveXattr { node, name }),
        2 => pick().prop_map(|node| Op::Forget { node }),
        1 => Just(Op::Reopen),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Running a sequence against the volume and the model.

fn errname(e: i32) -> String {
    let name = match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EINVAL => "EINVAL",
        libc::ENODATA => "ENODATA",
        libc::EPERM => "EPERM",
        libc::ENXIO => "ENXIO",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EIO => "EIO",
        _ => return format!("errno {e}"),
    };
    name.to_owned()
}

type Stats = RefCell<BTreeMap<String, u64>>;

struct Harness<'a> {
    host: &'a TestHost,
    tenant: String,
    vol: Option<Volume>,
    model: Model,
    /// The highest inode number seen in this case.
    max_ino: u64,
    stats: &'a Stats,
    /// What the current step is, for failure messages.
    ctx: String,
}

impl<'a> Harness<'a> {
    fn new(host: &'a TestHost, stats: &'a Stats) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tenant = format!("model{}", NEXT.fetch_add(1, Ordering::Relaxed));
        tenants::create(&host.data, &host.host, &tenant, Some(BS)).unwrap();
        let vol = Volume::open(tenants::open(&host.data, &host.host, &tenant).unwrap()).unwrap();
        assert_eq!(u64::from(vol.block_size()), BS);
        Harness {
            host,
            tenant,
            vol: Some(vol),
            model: Model::new(),
            max_ino: ROOT_INO,
            stats,
            ctx: "initial state".into(),
        }
    }

    /// Closes the volume and deletes the tenant.
    fn finish(mut self) {
        drop(self.vol.take());
        tenants::delete(&self.host.data, &self.tenant).unwrap();
    }

    fn vol(&self) -> &Volume {
        self.vol.as_ref().unwrap()
    }

    fn reopen(&mut self) {
        drop(self.vol.take());
        let tenant = tenants::open(&self.host.data, &self.host.host, &self.tenant).unwrap();
        self.vol = Some(Volume::open(tenant).unwrap());
        for orphan in self.model.reopen() {
            let got = self.vol().getattr(orphan).map_err(|e| e.errno());
            assert!(
                got == Err(libc::ENOENT),
                "{}: orphan {orphan} survived reopen: {got:?}",
                self.ctx
            );
        }
    }

    fn count(&self, op: &str, outcome: String) {
        *self
            .stats
            .borrow_mut()
            .entry(format!("{op} -> {outcome}"))
            .or_default() += 1;
    }

    /// Both succeeded or both failed with the same errno; records the outcome.
    fn agree<T: Debug, U: Debug>(&self, op: &str, expect: &R<T>, got: &R<U>) {
        match (expect, got) {
            (Ok(_), Ok(_)) => self.count(op, "ok".into()),
            (Err(e), Err(g)) if e == g => self.count(op, errname(*e)),
            _ => panic!(
                "{}: model says {:?}, volume says {:?}",
                self.ctx,
                expect.as_ref().map_err(|&e| errname(e)),
                got.as_ref().map_err(|&e| errname(e)),
            ),
        }
    }

    fn dirs(&self, wide: bool) -> Vec<u64> {
        let m = &self.model;
        let mut out: Vec<u64> = m
            .nodes
            .iter()
            .filter(|(_, n)| n.is_dir() && n.links > 0)
            .map(|(&i, _)| i)
            .collect();
        if wide {
            out.extend(
                m.nodes
                    .iter()
                    .filter(|(_, n)| n.is_dir() && n.links == 0)
                    .map(|(&i, _)| i),
            );
            out.extend(
                m.forgotten
                    .iter()
                    .filter(|(_, &k)| k == FileKind::Dir)
                    .map(|(&i, _)| i),
            );
        }
        out
    }

    fn all(&self, wide: bool) -> Vec<u64> {
        let mut out: Vec<u64> = self.model.nodes.keys().copied().collect();
        if wide {
            out.extend(self.model.forgotten.keys().copied());
        }
        out
    }

    fn files(&self, wide: bool) -> Vec<u64> {
        let files: Vec<u64> = self
            .model
            .nodes
            .iter()
            .filter(|(_, n)| matches!(n.body, Body::File(_)))
            .map(|(&i, _)| i)
            .collect();
        if wide || files.is_empty() {
            return self.all(true);
        }
        files
    }

    fn choose(list: &[u64], p: Pick) -> u64 {
        list[p.idx % list.len()]
    }

    fn pick_dir(&self, p: Pick) -> u64 {
        Self::choose(&self.dirs(p.wide), p)
    }

    fn pick_loc(&self, l: Loc) -> (u64, Vec<u8>) {
        if l.existing {
            let entries: Vec<(u64, &Vec<u8>)> = self
                .model
                .nodes
                .iter()
                .filter_map(|(&i, n)| match &n.body {
                    Body::Dir { entries, .. } => Some(entries.keys().map(move |k| (i, k))),
                    _ => None,
                })
                .flatten()
                .collect();
            if !entries.is_empty() {
                let (dir, name) = entries[l.dir.idx % entries.len()];
                return (dir, name.clone());
            }
        }
        (self.pick_dir(l.dir), entry_name(l.name))
    }

    fn pick_file(&self, p: Pick) -> u64 {
        Self::choose(&self.files(p.wide), p)
    }

    fn pick_any(&self, p: Pick) -> u64 {
        Self::choose(&self.all(p.wide), p)
    }

    /// The attributes the volume reports for `ino` match the model.
    fn check_attr(&self, ino: u64, attr: &Attr) {
        let n = &self.model.nodes[&ino];
        let ctx = &self.ctx;
        assert_eq!(attr.ino, ino, "{ctx}: ino");
        assert_eq!(attr.kind, n.kind(), "{ctx}: kind of {ino}");
        assert_eq!(attr.nlink, self.model.nlink(ino), "{ctx}: nlink of {ino}");
        assert_eq!(attr.size, self.model.size(ino), "{ctx}: size of {ino}");
        assert_eq!(attr.perm, n.perm, "{ctx}: perm of {ino}");
        assert_eq!(
            (attr.uid, attr.gid),
            (n.uid, n.gid),
            "{ctx}: owner of {ino}"
        );
        if n.is_dir() && n.links > 0 {
            assert_eq!(
                attr.parent,
                self.model.parent_of(ino),
                "{ctx}: parent of {ino}"
            );
        }
    }

    /// Every inode the model knows matches the volume; every other number is free.
    fn check_all(&self) {
        let vol = self.vol();
        let ctx = &self.ctx;
        for (&ino, n) in &self.model.nodes {
            let attr = vol
                .getattr(ino)
                .unwrap_or_else(|e| panic!("{ctx}: getattr({ino}): {e}"));
            self.check_attr(ino, &attr);
            match &n.body {
                Body::File(data) => {
                    let got = vol.read(ino, 0, data.len() as u32 + 100).unwrap();
                    if &got != data {
                        let first = got
                            .iter()
                            .zip(data)
                            .position(|(a, b)| a != b)
                            .unwrap_or(got.len().min(data.len()));
                        panic!(
                            "{ctx}: contents of {ino} differ: volume {} bytes, model {}, first \
                             difference at {first}",
                            got.len(),
                            data.len()
                        );
                    }
                }
                Body::Dir { entries, .. } => {
                    let got: Vec<(Vec<u8>, u64, FileKind)> = vol
                        .readdir(ino)
                        .unwrap()
                        .into_iter()
                        .map(|e| (e.name, e.ino, e.kind))
                        .collect();
                    let want: Vec<(Vec<u8>, u64, FileKind)> = entries
                        .iter()
                        .map(|(name, &c)| (name.clone(), c, self.model.nodes[&c].kind()))
                        .collect();
                    assert_eq!(got, want, "{ctx}: listing of {ino}");
                    for (name, c, _) in &want {
                        assert_eq!(vol.lookup(ino, name).unwrap().ino, *c, "{ctx}: lookup");
                    }
                }
                Body::Symlink(t) => {
                    assert_eq!(&vol.readlink(ino).unwrap(), t, "{ctx}: target of {ino}")
                }
            }
            assert_eq!(
                vol.listxattr(ino).unwrap(),
                self.model.listxattr(ino),
                "{ctx}: xattr names of {ino}"
            );
            for (name, value) in &n.xattrs {
                assert_eq!(
                    &vol.getxattr(ino, name).unwrap(),
                    value,
                    "{ctx}: xattr of {ino}"
                );
            }
        }
        for ino in 1..=self.max_ino + 2 {
            if !self.model.nodes.contains_key(&ino) {
                let got = vol.getattr(ino).map_err(|e| e.errno());
                assert!(
                    got == Err(libc::ENOENT),
                    "{ctx}: inode {ino} should not exist: {got:?}"
                );
            }
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Create { dir, name, kind } => self.create(dir, name, kind),
            Op::Lookup { at } => {
                let (parent, name) = self.pick_loc(at);
                let expect = self.model.lookup(parent, &name);
                let got = self.vol().lookup(parent, &name).map_err(|e| e.errno());
                self.agree("lookup", &expect, &got);
                if let (Ok(child), Ok(attr)) = (expect, got) {
                    assert_eq!(attr.ino, child, "{}", self.ctx);
                    self.check_attr(child, &attr);
                }
            }
            Op::Unlink { at } => {
                let (parent, name) = self.pick_loc(at);
                let expect = self.model.remove(parent, &name, false);
                let got = self.vol().unlink(parent, &name).map_err(|e| e.errno());
                self.agree("unlink", &expect, &got);
            }
            Op::Rmdir { at } => {
                let (parent, name) = self.pick_loc(at);
                let expect = self.model.remove(parent, &name, true);
                let got = self.vol().rmdir(parent, &name).map_err(|e| e.errno());
                self.agree("rmdir", &expect, &got);
            }
            Op::Rename { from, to, mode } => {
                let (parent, name) = self.pick_loc(from);
                let (newparent, newname) = self.pick_loc(to);
                let same = {
                    let m = &self.model;
                    let src = m.entries(parent).ok().and_then(|e| e.get(&name));
                    src.is_some() && src == m.entries(newparent).ok().and_then(|e| e.get(&newname))
                };
                let expect = self.model.rename(parent, &name, newparent, &newname, mode);
                let got = self
                    .vol()
                    .rename(parent, &name, newparent, &newname, mode)
                    .map_err(|e| e.errno());
                let label = if same {
                    "rename (same inode)"
                } else {
                    "rename"
                };
                self.agree(&format!("{label} {mode:?}"), &expect, &got);
            }
            Op::Link { node, to } => {
                let ino = self.pick_any(node);
                let (newparent, newname) = self.pick_loc(to);
                let expect = self.model.link(ino, newparent, &newname);
                let got = self
                    .vol()
                    .link(ino, newparent, &newname)
                    .map_err(|e| e.errno());
                self.agree("link", &expect, &got);
                if let Ok(attr) = got {
                    self.check_attr(ino, &attr);
                }
            }
            Op::Readlink { node } => {
                let ino = self.pick_any(node);
                let expect = self.model.readlink(ino);
                let got = self.vol().readlink(ino).map_err(|e| e.errno());
                self.agree("readlink", &expect, &got);
                assert_eq!(expect.ok(), got.ok(), "{}", self.ctx);
            }
            Op::Write {
                node,
                offset,
                len,
                fill,
            } => {
                let ino = self.pick_file(node);
                let data = fill.bytes(len as usize);
                let expect = self.model.write(ino, offset, &data);
                let got = self.vol().write(ino, offset, &data).map_err(|e| e.errno());
                self.agree("write", &expect, &got);
                assert_eq!(expect.ok(), got.ok(), "{}: bytes written", self.ctx);
            }
            Op::Read { node, offset, len } => {
                let ino = self.pick_file(node);
                let expect = self.model.read(ino, offset, len);
                let got = self.vol().read(ino, offset, len).map_err(|e| e.errno());
                self.agree("read", &expect, &got);
                assert!(expect.ok() == got.ok(), "{}: bytes read differ", self.ctx);
            }
            Op::Truncate { node, size } => {
                let ino = self.pick_file(node);
                let expect = self.model.truncate(ino, size);
                let set = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                let got = self.vol().setattr(ino, &set).map_err(|e| e.errno());
                self.agree("truncate", &expect, &got);
                if let Ok(attr) = got {
                    self.check_attr(ino, &attr);
                }
            }
            Op::Fallocate {
                node,
                offset,
                len,
                mode,
            } => {
                let ino = self.pick_file(node);
                let expect = self.model.fallocate(ino, offset, len, mode);
                let got = self
                    .vol()
                    .fallocate(ino, offset, len, mode)
                    .map_err(|e| e.errno());
                self.agree(&format!("fallocate {mode:?}"), &expect, &got);
            }
            Op::SeekData { node, offset } => self.seek(node, offset, true),
            Op::SeekHole { node, offset } => self.seek(node, offset, false),
            Op::SetXattr {
                node,
                name,
                ref value,
                mode,
            } => {
                let (ino, name) = (self.pick_any(node), xattr_name(name));
                let expect = self.model.setxattr(ino, &name, value, mode);
                let got = self
                    .vol()
                    .setxattr(ino, &name, value, mode)
                    .map_err(|e| e.errno());
                self.agree(&format!("setxattr {mode:?}"), &expect, &got);
            }
            Op::GetXattr { node, name } => {
                let (ino, name) = (self.pick_any(node), xattr_name(name));
                let expect = self.model.getxattr(ino, &name);
                let got = self.vol().getxattr(ino, &name).map_err(|e| e.errno());
                self.agree("getxattr", &expect, &got);
                assert_eq!(expect.ok(), got.ok(), "{}: xattr value", self.ctx);
            }
            Op::RemoveXattr { node, name } => {
                let (ino, name) = (self.pick_any(node), xattr_name(name));
                let expect = self.model.removexattr(ino, &name);
                let got = self.vol().removexattr(ino, &name).map_err(|e| e.errno());
                self.agree("removexattr", &expect, &got);
            }
            Op::Forget { node } => {
                // Prefer orphans: forgetting a linked inode changes nothing.
                let orphans: Vec<u64> = self
                    .model
                    .nodes
                    .keys()
                    .copied()
                    .filter(|&i| self.model.nlink(i) == 0)
                    .collect();
                let ino = if orphans.is_empty() || node.wide {
                    self.pick_any(node)
                } else {
                    Self::choose(&orphans, node)
                };
                let freed = self.model.nodes.contains_key(&ino) && self.model.nlink(ino) == 0;
                self.model.forget(ino);
                self.vol()
                    .forget(ino)
                    .unwrap_or_else(|e| panic!("{}: forget: {e}", self.ctx));
                self.count("forget", if freed { "freed" } else { "kept" }.into());
            }
            Op::Reopen => {
                self.reopen();
                self.count("reopen", "ok".into());
            }
        }
    }

    fn create(&mut self, dir: Pick, name: usize, kind: NewKind) {
        let parent = self.pick_dir(dir);
        let name = entry_name(name);
        let vol = self.vol.as_ref().unwrap();
        let (label, expect, got, node) = match kind {
            NewKind::File => (
                "mknod",
                self.model.check_create(parent, &name),
                vol.mknod(parent, &name, FileKind::File, 0o644, OWNER, 0),
                Node::new(Body::File(Vec::new()), 0o644),
            ),
            NewKind::Dir => (
                "mkdir",
                self.model.check_create(parent, &name),
                vol.mkdir(parent, &name, 0o755, OWNER),
                Node::new(
                    Body::Dir {
                        entries: BTreeMap::new(),
                        parent,
                    },
                    0o755,
                ),
            ),
            NewKind::Symlink(t) => {
                let target = link_target(t);
                let expect = if target.is_empty() {
                    Err(libc::ENOENT)
                } else if target.len() > 4095 {
                    Err(libc::ENAMETOOLONG)
                } else {
                    self.model.check_create(parent, &name)
                };
                (
                    "symlink",
                    expect,
                    vol.symlink(parent, &name, &target, OWNER),
                    Node::new(Body::Symlink(target), 0o777),
                )
            }
        };
        let got = got.map_err(|e| e.errno());
        self.agree(label, &expect, &got);
        if let Ok(attr) = got {
            let ino = attr.ino;
            assert!(
                !self.model.nodes.contains_key(&ino) && !self.model.forgotten.contains_key(&ino),
                "{}: inode number {ino} reused while still known",
                self.ctx
            );
            self.max_ino = self.max_ino.max(ino);
            self.model.add(parent, &name, ino, node);
            self.check_attr(ino, &attr);
        }
    }

    fn seek(&mut self, node: Pick, offset: u64, data: bool) {
        let ino = self.pick_file(node);
        let label = if data { "seek_data" } else { "seek_hole" };
        let contents = match self.model.nodes.get(&ino).map(|n| &n.body) {
            None => None,
            Some(Body::File(d)) => Some(d.clone()),
            Some(_) => return, // only files are seekable this way
        };
        let vol = self.vol();
        let got = if data {
            vol.seek_data(ino, offset)
        } else {
            vol.seek_hole(ino, offset)
        }
        .map_err(|e| e.errno());
        let ctx = &self.ctx;
        let Some(contents) = contents else {
            self.agree(label, &Err::<u64, _>(libc::ENOENT), &got);
            return;
        };
        let size = contents.len() as u64;
        if offset >= size {
            self.agree(label, &Err::<u64, _>(libc::ENXIO), &got);
            return;
        }
        let zeros =
            |from: u64, to: u64| contents[from as usize..to as usize].iter().all(|&b| b == 0);
        match (data, got) {
            (true, Ok(r)) => {
                assert!(
                    offset <= r && r < size,
                    "{ctx}: seek_data -> {r}, size {size}"
                );
                assert!(zeros(offset, r), "{ctx}: seek_data -> {r} skipped data");
                self.count(label, "ok".into());
            }
            (true, Err(libc::ENXIO)) => {
                assert!(
                    zeros(offset, size),
                    "{ctx}: seek_data ENXIO but data follows"
                );
                self.count(label, "ENXIO".into());
            }
            (false, Ok(r)) => {
                assert!(
                    offset <= r && r <= size,
                    "{ctx}: seek_hole -> {r}, size {size}"
                );
                let block_end = ((r / BS) + 1) * BS;
                assert!(
                    zeros(r, block_end.min(size)),
                    "{ctx}: seek_hole -> {r}, but that is data"
                );
                self.count(label, if r == size { "eof" } else { "hole" }.into());
            }
            (_, got) => panic!("{ctx}: {label}({offset}) on a {size}-byte file: {got:?}"),
        }
    }
}

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

// ---------------------------------------------------------------------------------------------
// Hand-written cases for the trickier semantics.

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

fn errno<T: Debug>(r: Result<T, tenantfs::volume::VolumeError>) -> i32 {
    r.expect_err("should have failed").errno()
}

fn names(vol: &Volume, dir: u64) -> Vec<Vec<u8>> {
    vol.readdir(dir)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

#[test]
fn unlinked_file_stays_usable_until_forget() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "orphan");
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    let data = noise(1, 10_000);
    vol.write(f.ino, 0, &data).unwrap();
    vol.setxattr(f.ino, b"user.k", b"v", XattrMode::Any)
        .unwrap();
    vol.unlink(ROOT_INO, b"f").unwrap();

    assert_eq!(errno(vol.lookup(ROOT_INO, b"f")), libc::ENOENT);
    assert!(vol.readdir(ROOT_INO).unwrap().is_empty());
    let attr = vol.getattr(f.ino).unwrap();
    assert_eq!((attr.nlink, attr.size), (0, 10_000));
    // Still open: readable, writable, with its xattrs; but it cannot be linked back.
    assert_eq!(vol.read(f.ino, 0, 20_000).unwrap(), data);
    vol.write(f.ino, 10_000, b"tail").unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().size, 10_004);
    assert_eq!(vol.getxattr(f.ino, b"user.k").unwrap(), b"v");
    assert_eq!(errno(vol.link(f.ino, ROOT_INO, b"g")), libc::ENOENT);

    vol.forget(f.ino).unwrap();
    assert_eq!(errno(vol.getattr(f.ino)), libc::ENOENT);
    assert_eq!(errno(vol.read(f.ino, 0, 10)), libc::ENOENT);
    assert_eq!(errno(vol.write(f.ino, 0, b"x")), libc::ENOENT);
    assert_eq!(errno(vol.getxattr(f.ino, b"user.k")), libc::ENOENT);
    assert_eq!(errno(vol.listxattr(f.ino)), libc::ENOENT);
    vol.forget(f.ino).unwrap(); // twice is harmless
}

#[test]
fn forget_keeps_inodes_that_still_have_links() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "linked");
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    vol.write(f.ino, 0, b"hello").unwrap();
    assert_eq!(vol.link(f.ino, ROOT_INO, b"g").unwrap().nlink, 2);
    vol.unlink(ROOT_INO, b"f").unwrap();
    vol.forget(f.ino).unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(vol.read(f.ino, 0, 10).unwrap(), b"hello");
    vol.forget(ROOT_INO).unwrap();
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 2);
    // The last link goes: now forget frees it.
    vol.unlink(ROOT_INO, b"g").unwrap();
    assert_eq!(vol.read(f.ino, 0, 10).unwrap(), b"hello");
    vol.forget(f.ino).unwrap();
    assert_eq!(errno(vol.getattr(f.ino)), libc::ENOENT);
}

#[test]
fn orphans_are_purged_at_reopen() {
    let t = TestHost::new(DirectIo::Auto);
    let mut orphans = Vec::new();
    {
        let vol = open_volume(&t, "purge");
        let keeper = vol
            .mknod(ROOT_INO, b"keeper", FileKind::File, 0o644, OWNER, 0)
            .unwrap();
        vol.write(keeper.ino, 0, b"kept").unwrap();
        // Unlinked while open.
        let f = vol
            .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
            .unwrap();
        vol.write(f.ino, 0, &noise(2, 9000)).unwrap();
        vol.setxattr(f.ino, b"user.k", b"v", XattrMode::Any)
            .unwrap();
        vol.unlink(ROOT_INO, b"f").unwrap();
        // Removed while open.
        let d = vol.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
        vol.setxattr(d.ino, b"user.k", b"v", XattrMode::Any)
            .unwrap();
        vol.rmdir(ROOT_INO, b"d").unwrap();
        // Replaced by a rename while open.
        let v = vol
            .mknod(ROOT_INO, b"v", FileKind::File, 0o644, OWNER, 0)
            .unwrap();
        vol.write(v.ino, 5000, b"victim").unwrap();
        vol.rename(ROOT_INO, b"keeper", ROOT_INO, b"v", RenameMode::Replace)
            .unwrap();
        assert_eq!(vol.getattr(v.ino).unwrap().nlink, 0);
        assert_eq!(vol.read(v.ino, 5000, 10).unwrap(), b"victim");
        orphans.extend([f.ino, d.ino, v.ino]);
    }
    let vol = open_volume(&t, "purge");
    for &o in &orphans {
        assert_eq!(errno(vol.getattr(o)), libc::ENOENT, "orphan {o}");
        assert_eq!(errno(vol.read(o, 0, 10)), libc::ENOENT, "orphan {o}");
        vol.forget(o).unwrap();
    }
    assert_eq!(names(&vol, ROOT_INO), vec![b"v".to_vec()]);
    let kept = vol.lookup(ROOT_INO, b"v").unwrap();
    assert_eq!(vol.read(kept.ino, 0, 10).unwrap(), b"kept");
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 2);
    // Numbers of purged inodes may be handed out again: nothing of the old inode shows.
    let max = *orphans.iter().max().unwrap();
    for i in 0..=orphans.len() {
        let name = format!("new{i}");
        let n = if i % 2 == 0 {
            vol.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, OWNER, 0)
                .unwrap()
        } else {
            vol.mkdir(ROOT_INO, name.as_bytes(), 0o755, OWNER).unwrap()
        };
        assert_eq!(n.size, 0);
        assert!(vol.listxattr(n.ino).unwrap().is_empty(), "ino {}", n.ino);
        if n.kind == FileKind::File {
            vol.setattr(
                n.ino,
                &SetAttr {
                    size: Some(20_000),
                    ..SetAttr::default()
                },
            )
            .unwrap();
            assert!(vol.read(n.ino, 0, 20_000).unwrap().iter().all(|&b| b == 0));
        } else {
            assert!(vol.readdir(n.ino).unwrap().is_empty());
        }
        if n.ino > max {
            break;
        }
    }
}

#[test]
fn removed_directory_takes_no_new_entries() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "deaddir");
    let d = vol.mkdir(ROOT_INO, b"d", 0o755, OWNER).unwrap();
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    vol.rmdir(ROOT_INO, b"d").unwrap();
    assert_eq!(vol.getattr(d.ino).unwrap().nlink, 0);
    assert_eq!(
        errno(vol.mknod(d.ino, b"x", FileKind::File, 0o644, OWNER, 0)),
        libc::ENOENT
    );
    assert_eq!(errno(vol.mkdir(d.ino, b"x", 0o755, OWNER)), libc::ENOENT);
    assert_eq!(errno(vol.symlink(d.ino, b"x", b"t", OWNER)), libc::ENOENT);
    assert_eq!(errno(vol.link(f.ino, d.ino, b"x")), libc::ENOENT);
    for mode in [RenameMode::Replace, RenameMode::NoReplace] {
        assert_eq!(
            errno(vol.rename(ROOT_INO, b"f", d.ino, b"x", mode)),
            libc::ENOENT
        );
    }
    assert!(vol.readdir(d.ino).unwrap().is_empty());
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(names(&vol, ROOT_INO), vec![b"f".to_vec()]);
    vol.forget(d.ino).unwrap();
    assert_eq!(errno(vol.getattr(d.ino)), libc::ENOENT);
    assert_eq!(errno(vol.readdir(d.ino)), libc::ENOENT);
}

#[test]
fn empty_writes_and_reads() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "empty");
    let f = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    // A zero-length write past the end writes nothing and leaves the size alone.
    assert_eq!(vol.write(f.ino, 5000, b"").unwrap(), 0);
    assert_eq!(vol.getattr(f.ino).unwrap().size, 0);
    vol.write(f.ino, 100, &noise(3, 3 * BS as usize)).unwrap();
    assert_eq!(vol.write(f.ino, 50_000, b"").unwrap(), 0);
    assert_eq!(vol.getattr(f.ino).unwrap().size, 100 + 3 * BS);
    // Zero-length reads anywhere, including offset 0 of a multi-block file.
    for off in [0, 1, BS - 1, BS, BS + 1, 3 * BS, 100 + 3 * BS, 60_000] {
        assert!(
            vol.read(f.ino, off, 0).unwrap().is_empty(),
            "read({off}, 0)"
        );
    }
    // Zero-length fallocate is EINVAL, as fallocate(2) says.
    assert_eq!(
        errno(vol.fallocate(f.ino, 0, 0, Fallocate::PunchHole)),
        libc::EINVAL
    );
}

#[test]
fn rename_and_link_errors_follow_linux() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "rename");
    let a = vol.mkdir(ROOT_INO, b"a", 0o755, OWNER).unwrap();
    let b = vol.mkdir(a.ino, b"b", 0o755, OWNER).unwrap();
    let f = vol
        .mknod(a.ino, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    let e = vol.mkdir(ROOT_INO, b"e", 0o755, OWNER).unwrap();
    let g = vol
        .mknod(ROOT_INO, b"g", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    use RenameMode::*;
    // Into its own subtree, either way round.
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"a", b.ino, b"x", Replace)),
        libc::EINVAL
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"a", a.ino, b"x", Replace)),
        libc::EINVAL
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"a", b.ino, b"x", NoReplace)),
        libc::EINVAL
    );
    // Over an ancestor: ENOTEMPTY, whatever the source is (EINVAL for exchange).
    for name in [&b"f"[..], b"b"] {
        for mode in [Replace, NoReplace, Exchange] {
            let want = match mode {
                Replace => libc::ENOTEMPTY,
                NoReplace => libc::EEXIST,
                Exchange => libc::EINVAL,
            };
            assert_eq!(
                errno(vol.rename(a.ino, name, ROOT_INO, b"a", mode)),
                want,
                "{name:?} {mode:?}"
            );
        }
    }
    // Type mismatches and non-empty targets.
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"g", ROOT_INO, b"e", Replace)),
        libc::EISDIR
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"e", ROOT_INO, b"g", Replace)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"e", ROOT_INO, b"a", Replace)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"x", ROOT_INO, b"g", Exchange)),
        libc::ENOENT
    );
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"g", ROOT_INO, b"x", Exchange)),
        libc::ENOENT
    );
    // Two names of one inode: rename does nothing, except NoReplace which sees a target.
    vol.link(g.ino, a.ino, b"g2").unwrap();
    for mode in [Replace, Exchange] {
        vol.rename(ROOT_INO, b"g", a.ino, b"g2", mode).unwrap();
    }
    assert_eq!(
        errno(vol.rename(ROOT_INO, b"g", a.ino, b"g2", NoReplace)),
        libc::EEXIST
    );
    assert_eq!(vol.getattr(g.ino).unwrap().nlink, 2);
    assert_eq!(vol.lookup(ROOT_INO, b"g").unwrap().ino, g.ino);
    assert_eq!(vol.lookup(a.ino, b"g2").unwrap().ino, g.ino);
    // Links: an existing name first, then a directory source.
    assert_eq!(errno(vol.link(b.ino, a.ino, b"f")), libc::EEXIST);
    assert_eq!(errno(vol.link(b.ino, ROOT_INO, b"new")), libc::EPERM);
    // A directory over an empty one, across parents: the link counts follow.
    vol.rename(a.ino, b"b", ROOT_INO, b"e", Replace).unwrap();
    assert_eq!(vol.getattr(e.ino).unwrap().nlink, 0);
    assert_eq!(vol.getattr(b.ino).unwrap().parent, ROOT_INO);
    assert_eq!(vol.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 4); // a, e (now b), + 2
                                                         // Exchange a directory and a file across parents.
    vol.rename(ROOT_INO, b"e", a.ino, b"f", Exchange).unwrap();
    assert_eq!(vol.getattr(b.ino).unwrap().parent, a.ino);
    assert_eq!(vol.getattr(a.ino).unwrap().nlink, 3);
    assert_eq!(vol.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(vol.lookup(ROOT_INO, b"e").unwrap().ino, f.ino);
}

/// A store written in the old data format (a leading tag byte on every extent value) is
/// refused with a message that names the tenant, the format and what to do, and left as is.
#[test]
fn a_store_of_the_old_data_format_is_refused() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "old");
    let a = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    vol.write(a.ino, 0, &noise(1, 3 * BS as usize)).unwrap();
    drop(vol);
    let old_meta = {
        let tenant = tenants::open(&t.data, &t.host, "old").unwrap();
        let mut meta = 1u32.to_be_bytes().to_vec();
        meta.extend_from_slice(&(BS as u32).to_be_bytes());
        tenant
            .db()
            .put(tenantfs::store::Family::Meta, b"volume", &meta)
            .unwrap();
        meta
    };
    let err = Volume::open(tenants::open(&t.data, &t.host, "old").unwrap())
        .err()
        .expect("an old-format store opened");
    assert!(
        matches!(err, tenantfs::volume::VolumeError::Format { found: 1, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    for part in [
        "tenant old",
        "data format 1",
        "reads formats 2 to 4",
        "copy the files out",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg:?}");
    }
    // Refused, not changed: the record is still the old one.
    let tenant = tenants::open(&t.data, &t.host, "old").unwrap();
    assert_eq!(
        tenant
            .db()
            .get(tenantfs::store::Family::Meta, b"volume")
            .unwrap()
            .unwrap(),
        old_meta
    );
}

/// Extent keys of `name`'s store: (block keys, chunk keys).
fn extent_key_counts(vol: &Volume) -> (usize, usize) {
    let (mut blocks, mut chunks) = (0, 0);
    vol.tenant()
        .db()
        .keys(tenantfs::store::Family::Extents, &[], &[0xff; 17], |k| {
            match k.len() {
                16 => blocks += 1,
                17 => chunks += 1,
                n => panic!("an extent key of {n} bytes"),
            }
            true
        })
        .unwrap();
    (blocks, chunks)
}

/// Whole aligned 64 KiB runs are stored as one chunk value each; smaller writes into them
/// (which go over them, then are folded into them), holes punched into them, a block of zeros
/// written into them and truncation through them read back exactly, and lseek finds the holes
/// exactly, before and after a reopen.
#[test]
fn chunks_take_writes_holes_and_truncation() {
    const CHUNK: u64 = 16 * BS;
    let t = TestHost::new(DirectIo::Auto);
    let mut vol = open_volume(&t, "chunks");
    let ino = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap()
        .ino;
    let mut model = noise(7, 16 * CHUNK as usize);
    vol.write(ino, 0, &model).unwrap();
    assert_eq!(extent_key_counts(&vol), (0, 16), "1 MiB in 16 chunk values");
    let check = |vol: &Volume, model: &[u8], what: &str| {
        let got = vol.read(ino, 0, model.len() as u32 + 10).unwrap();
        assert!(got == model, "{what}: contents differ from the model");
        for at in [0, BS + 3, CHUNK - 1, 5 * CHUNK + 100] {
            let got = vol.read(ino, at, 6000).unwrap();
            let want =
                &model[(at as usize).min(model.len())..(at as usize + 6000).min(model.len())];
            assert!(got == want, "{what}: 6000 bytes at {at} differ");
        }
    };
    let write = |vol: &Volume, model: &mut Vec<u8>, at: u64, data: &[u8]| {
        vol.write(ino, at, data).unwrap();
        let end = at as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[at as usize..end].copy_from_slice(data);
    };
    // A block over a chunk, part of a block over a chunk (read, patch, write).
    write(&vol, &mut model, 2 * BS, &noise(8, BS as usize));
    write(&vol, &mut model, CHUNK + 1000, &noise(9, 100));
    check(&vol, &model, "blocks written into chunks");
    assert_eq!(
        extent_key_counts(&vol),
        (2, 16),
        "the blocks go over the chunks until they are folded"
    );
    vol.fold_now();
    check(&vol, &model, "blocks written into chunks, folded");
    assert_eq!(
        extent_key_counts(&vol),
        (0, 16),
        "the blocks over the two chunks are merged into them"
    );
    // A block of zeros in chunk 2: a hole, found by SEEK_HOLE exactly.
    write(&vol, &mut model, 2 * CHUNK + 3 * BS, &vec![0; BS as usize]);
    check(&vol, &model, "zero block");
    assert_eq!(vol.seek_hole(ino, 2 * CHUNK).unwrap(), 2 * CHUNK + 3 * BS);
    assert_eq!(
        vol.seek_data(ino, 2 * CHUNK + 3 * BS).unwrap(),
        2 * CHUNK + 4 * BS
    );
    // A hole punched inside chunk 3 and across chunks 5 and 6 (whole), zeroes inside chunk 7.
    vol.fallocate(ino, 3 * CHUNK + BS, 2 * BS, Fallocate::PunchHole)
        .unwrap();
    model[(3 * CHUNK + BS) as usize..(3 * CHUNK + 3 * BS) as usize].fill(0);
    vol.fallocate(ino, 5 * CHUNK, 2 * CHUNK, Fallocate::PunchHole)
        .unwrap();
    model[(5 * CHUNK) as usize..(7 * CHUNK) as usize].fill(0);
    vol.fallocate(
        ino,
        7 * CHUNK + 10,
        300,
        Fallocate::ZeroRange { keep_size: true },
    )
    .unwrap();
    model[(7 * CHUNK + 10) as usize..(7 * CHUNK + 310) as usize].fill(0);
    check(&vol, &model, "holes");
    assert_eq!(vol.seek_hole(ino, 3 * CHUNK).unwrap(), 3 * CHUNK + BS);
    assert_eq!(
        vol.seek_data(ino, 3 * CHUNK + BS).unwrap(),
        3 * CHUNK + 3 * BS
    );
    assert_eq!(vol.seek_hole(ino, 4 * CHUNK).unwrap(), 5 * CHUNK);
    assert_eq!(vol.seek_data(ino, 5 * CHUNK).unwrap(), 7 * CHUNK);
    // A chunk rewritten whole drops the blocks that overlaid it.
    write(&vol, &mut model, 0, &noise(10, CHUNK as usize));
    write(&vol, &mut model, CHUNK, &noise(11, 2 * CHUNK as usize));
    check(&vol, &model, "chunks rewritten");
    // Truncation mid-chunk, then growth: the cut-off bytes read as zeros.
    let cut = 9 * CHUNK + 5000;
    vol.setattr(
        ino,
        &SetAttr {
            size: Some(cut),
            ..Default::default()
        },
    )
    .unwrap();
    model.truncate(cut as usize);
    write(&vol, &mut model, 12 * CHUNK, &noise(12, 100));
    check(&vol, &model, "truncated and grown");
    assert_eq!(vol.seek_hole(ino, 9 * CHUNK).unwrap(), 9 * CHUNK + 2 * BS);
    drop(vol);
    vol = open_volume(&t, "chunks");
    check(&vol, &model, "after reopen");
    // (Chunk 2's hole was written over whole.)
    assert_eq!(vol.seek_hole(ino, 2 * CHUNK).unwrap(), 3 * CHUNK + BS);
    assert_eq!(vol.seek_hole(ino, 9 * CHUNK).unwrap(), 9 * CHUNK + 2 * BS);
}

/// A store of data format 2 (block keys only) is taken over: its files read as before and its
/// version becomes 3, so an older tenantfs will not open it. A newer format is refused.
#[test]
fn a_store_of_format_2_is_migrated_and_a_newer_one_refused() {
    let t = TestHost::new(DirectIo::Auto);
    let vol = open_volume(&t, "two");
    let a = vol
        .mknod(ROOT_INO, b"f", FileKind::File, 0o644, OWNER, 0)
        .unwrap();
    let data = noise(3, 3 * BS as usize + 17);
    for (i, piece) in data.chunks(BS as usize).enumerate() {
        vol.write(a.ino, i as u64 * BS, piece).unwrap();
    }
    drop(vol);
    let set_format = |format: u32| {
        let tenant = tenants::open(&t.data, &t.host, "two").unwrap();
        let mut meta = format.to_be_bytes().to_vec();
        meta.extend_from_slice(&(BS as u32).to_be_bytes());
        tenant
            .db()
            .put(tenantfs::store::Family::Meta, b"volume", &meta)
            .unwrap();
    };
    let format = || {
        let tenant = tenants::open(&t.data, &t.host, "two").unwrap();
        let v = tenant
            .db()
            .get(tenantfs::store::Family::Meta, b"volume")
            .unwrap()
            .unwrap();
        u32::from_be_bytes(v[..4].try_into().unwrap())
    };
    set_format(2);
    let vol = open_volume(&t, "two");
    assert!(vol.read(a.ino, 0, 1 << 20).unwrap() == data);
    drop(vol);
    assert_eq!(format(), 4, "the version was not moved on");
    // Format 3 (no extent files) reads as it is, too.
    set_format(3);
    let vol = open_volume(&t, "two");
    assert!(vol.read(a.ino, 0, 1 << 20).unwrap() == data);
    drop(vol);
    assert_eq!(format(), 4, "the version was not moved on from 3");
    set_format(5);
    let err = Volume::open(tenants::open(&t.data, &t.host, "two").unwrap())
        .err()
        .expect("a newer-format store opened");
    let msg = err.to_string();
    for part in [
        "tenant two",
        "data format 5",
        "newer tenantfs",
        "reads formats 2 to 4",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg:?}");
    }
    assert_eq!(format(), 5, "a refused store was changed");
}

// ---------------------------------------------------------------------------------------------
// kill -9 during blob garbage collection.

const GC_CHILD_ENV: &str = "TENANTFS_TEST_GC_CHILD";
const GC_KEEP: usize = 32 << 20;
const GC_CHURN: usize = 8 << 20;

fn gc_file(vol: &Volume, name: &str) -> u64 {
    match vol.lookup(ROOT_INO, name.as_bytes()) {
        Ok(a) => a.ino,
        Err(_) => {
            vol.mknod(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, OWNER, 0)
                .unwrap()
                .ino
        }
    }
}

/// Writes `data` into file `name` in 128 KiB writes: whole chunks, but below the bulk size,
/// so they are blob values (bulk writes go to extent files, collected apart).
fn gc_write(vol: &Volume, name: &str, data: &[u8]) {
    write_in(vol, name, data, 128 << 10);
}

fn write_in(vol: &Volume, name: &str, data: &[u8], piece: usize) {
    let ino = gc_file(vol, name);
    for (i, chunk) in data.chunks(piece).enumerate() {
        vol.write(ino, (i * piece) as u64, chunk).unwrap();
    }
}

fn gc_read(vol: &Volume, name: &str, len: usize) -> Vec<u8> {
    let ino = vol.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
    assert_eq!(vol.getattr(ino).unwrap().size, len as u64, "{name}: size");
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while out.len() < len {
        vol.read_into(ino, out.len() as u64, 1 << 20, &mut buf)
            .unwrap();
        assert!(!buf.is_empty(), "{name}: short read at {}", out.len());
        out.extend_from_slice(&buf);
    }
    out
}

fn blob_files(dir: &std::path::Path) -> Vec<(String, u64)> {
    common::files_under(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blob"))
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p.file_name().unwrap().to_string_lossy().into_owned(), len)
        })
        .collect()
}

/// The child: one more synced overwrite of `churn` (its content named by the trial), then
/// blob GC over and over, each run announced on stdout, until killed.
fn gc_child(root: &str, trial: u64) {
    let vol = open_in_child(root, "gc");
    gc_write(&vol, "churn", &noise(1000 + trial, GC_CHURN));
    vol.fsync().unwrap();
    for i in 0.. {
        println!("GC start {i}");
        vol.tenant().db().collect_blob_garbage();
        println!("GC done {i}");
    }
}

/// Blob GC moves live file data from old blob files into new ones while it deletes the old:
/// a kill -9 at any point of it loses nothing that was synced, the partial blob file it was
/// writing is deleted at the next open (RocksDB itself keeps it forever), and the space of
/// overwritten data comes back once GC completes.
#[test]
fn kill9_during_blob_garbage_collection_loses_nothing_synced() {
    if let Ok(spec) = std::env::var(GC_CHILD_ENV) {
        let (root, trial) = spec.split_once(':').unwrap();
        gc_child(root, trial.parse().unwrap());
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    let keep = noise(7, GC_KEEP);
    let store_dir = {
        let vol = open_volume(&t, "gc");
        // `keep` goes into the oldest blob files and stays live; `churn` is overwritten with a
        // sync each time, so every flush makes a blob file and older ones fill with garbage.
        gc_write(&vol, "keep", &keep);
        vol.fsync().unwrap();
        for round in 0..5 {
            gc_write(&vol, "churn", &noise(100 + round, GC_CHURN));
            vol.fsync().unwrap();
        }
        drop(vol);
        tenantfs::data_dir::tenants_dir(&t.root).join("gc")
    };
    let mut killed_mid_gc = 0;
    for (trial, delay_ms) in [(1u64, 40u64), (2, 150), (3, 400)] {
        let before = blob_files(&store_dir);
        let mut child = spawn_child(
            "kill9_during_blob_garbage_collection_loses_nothing_synced",
            &[(GC_CHILD_ENV, format!("{}:{trial}", t.root.display()))],
        );
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let reader = {
            let lines = lines.clone();
            let out = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    if l.starts_with("GC ") {
                        lines.lock().unwrap().push(l);
                    }
                }
            })
        };
        let t0 = std::time::Instant::now();
        while lines.lock().unwrap().is_empty() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "the child never started GC"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let last = lines.lock().unwrap().last().cloned().unwrap();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        if last.starts_with("GC start") {
            killed_mid_gc += 1;
        }
        let vol = open_volume(&t, "gc");
        assert!(
            gc_read(&vol, "keep", GC_KEEP) == keep,
            "trial {trial}: keep changed"
        );
        assert!(
            gc_read(&vol, "churn", GC_CHURN) == noise(1000 + trial, GC_CHURN),
            "trial {trial}: churn is not its last synced content"
        );
        let after = blob_files(&store_dir);
        assert_ne!(before, after, "trial {trial}: GC changed no blob file");
        // The blob file the killed GC was writing is referenced by nothing: deleted at open.
        let live = (GC_KEEP + GC_CHURN) as u64;
        let blob_bytes: u64 = after.iter().map(|(_, l)| l).sum();
        assert!(
            blob_bytes < live + live / 4,
            "trial {trial}: {blob_bytes} bytes of blob files for {live} live bytes: {after:?}"
        );
    }
    assert!(
        killed_mid_gc >= 2,
        "only {killed_mid_gc} of 3 kills landed inside a GC run"
    );
    // A GC that runs to its end gives the space of the overwritten data back.
    let vol = open_volume(&t, "gc");
    vol.tenant().db().collect_blob_garbage();
    let live = (GC_KEEP + GC_CHURN) as u64;
    let blob_bytes: u64 = blob_files(&store_dir).iter().map(|(_, l)| l).sum();
    assert!(
        blob_bytes < live + live / 4,
        "blob files hold {blob_bytes} bytes for {live} live bytes after GC: {:?}",
        blob_files(&store_dir)
    );
    assert!(gc_read(&vol, "keep", GC_KEEP) == keep);
}

const FOLD_CHILD_ENV: &str = "TENANTFS_TEST_FOLD_CHILD";
const FOLD_FILE: usize = 4 << 20;

/// Extent keys of the volume (chunks, and blocks over them).
fn extent_keys(vol: &Volume) -> usize {
    let mut n = 0;
    vol.tenant()
        .db()
        .keys(tenantfs::store::Family::Extents, &[], &[0xff; 17], |_| {
            n += 1;
            true
        })
        .unwrap();
    n
}

/// The child: 4 KiB writes over the file, synced, then every fold at once (written without
/// the WAL), announced on stdout, then idle until killed.
fn fold_child(root: &str) {
    let vol = open_in_child(root, "fold");
    let ino = vol.lookup(ROOT_INO, b"f").unwrap().ino;
    for (at, block) in fold_overwrites() {
        vol.write(ino, at, &block).unwrap();
    }
    vol.fsync().unwrap();
    println!("KEYS {}", extent_keys(&vol));
    vol.fold_now();
    println!("FOLDED {}", extent_keys(&vol));
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Every 5th block of the file and a run of 32 blocks, rewritten with fresh noise.
fn fold_overwrites() -> Vec<(u64, Vec<u8>)> {
    (0..FOLD_FILE / 4096)
        .filter(|b| b % 5 == 0 || (300..332).contains(b))
        .map(|b| ((b * 4096) as u64, noise(5000 + b as u64, 4096)))
        .collect()
}

/// A fold merges the blocks over a chunk into it without the WAL (it changes how data is laid
/// out, not what it reads as): killed with folds in the memtable only, the store reopens with
/// the synced blocks over the old chunks, reads exactly what was synced, and a read that
/// meets them has them folded again.
#[test]
fn kill9_after_folds_loses_nothing_synced() {
    if let Ok(root) = std::env::var(FOLD_CHILD_ENV) {
        fold_child(&root);
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    let mut model = noise(11, FOLD_FILE);
    {
        let vol = open_volume(&t, "fold");
        // Bulk writes: the chunks are in extent files, and the folds read them from there.
        write_in(&vol, "f", &model, 1 << 20);
        vol.fsync().unwrap();
        assert_eq!(
            extent_keys(&vol),
            FOLD_FILE / (64 << 10),
            "written as chunks"
        );
    }
    for (at, block) in fold_overwrites() {
        model[at as usize..at as usize + block.len()].copy_from_slice(&block);
    }
    let mut child = spawn_child(
        "kill9_after_folds_loses_nothing_synced",
        &[(FOLD_CHILD_ENV, t.root.display().to_string())],
    );
    let mut counts = Vec::new();
    {
        use std::io::BufRead;
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        for line in out.lines().map_while(Result::ok) {
            // (The harness's "test NAME ... " may start the first line.)
            if let Some((_, n)) = line.split_once("KEYS ") {
                counts.push(n.parse::<usize>().unwrap());
            }
            if let Some((_, n)) = line.split_once("FOLDED ") {
                counts.push(n.parse::<usize>().unwrap());
                break;
            }
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let chunks = FOLD_FILE / (64 << 10);
    let overwrites = fold_overwrites().len();
    assert_eq!(
        counts,
        [chunks + overwrites, chunks],
        "the child's folds: blocks over chunks before, one key per chunk after"
    );
    let vol = open_volume(&t, "fold");
    assert_eq!(
        extent_keys(&vol),
        chunks + overwrites,
        "the folds were not flushed: the synced blocks are back over their chunks"
    );
    // The read meets the chunks left overlaid and queues them: they are folded again.
    assert!(
        gc_read(&vol, "f", FOLD_FILE) == model,
        "not what was synced"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while extent_keys(&vol) != chunks {
        assert!(std::time::Instant::now() < deadline, "not folded again");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        gc_read(&vol, "f", FOLD_FILE) == model,
        "the second fold changed bytes"
    );
}

/// Volume `name` of the data dir at `root`, opened by a crash test's child process.
fn open_in_child(root: &str, name: &str) -> Volume {
    let data = tenantfs::data_dir::DataDir::open(std::path::Path::new(root), None).unwrap();
    let host = tenantfs::store::StoreHost::builder()
        .block_cache_bytes(64 << 20)
        .build();
    Volume::open(tenants::open(&data, &host, name).unwrap()).unwrap()
}

/// This test binary run again as the child of crash test `test` (its stdout piped), with
/// `envs` telling it so.
fn spawn_child(test: &str, envs: &[(&str, String)]) -> std::process::Child {
    common::process::this_binary_running(&common::process::test_path(module_path!(), test))
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

const EXTENT_CHILD_ENV: &str = "TENANTFS_TEST_EXTENT_CHILD";
const EXTENT_FILE: usize = 16 << 20;

/// Round `round`'s bytes of piece `nth` (1 MiB) of the extent test's file.
fn extent_piece(round: u64, nth: usize) -> Vec<u8> {
    noise(round * 1000 + nth as u64, 1 << 20)
}

/// The child: rewrites the file in 1 MiB writes (bulk: into extent files), round after round,
/// fsyncing after each round and announcing it, until killed.
fn extent_child(root: &str) {
    let vol = open_in_child(root, "ext");
    let ino = vol.lookup(ROOT_INO, b"f").unwrap().ino;
    let first: u64 = std::env::var("TENANTFS_TEST_EXTENT_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    for round in first.. {
        for nth in 0..EXTENT_FILE >> 20 {
            vol.write(ino, (nth << 20) as u64, &extent_piece(round, nth))
                .unwrap();
        }
        vol.fsync().unwrap();
        // (The parent stops reading after the first: later lines may find no reader.)
        let _ = std::io::Write::write_all(
            &mut std::io::stdout(),
            format!("SYNCED {round}\n").as_bytes(),
        );
    }
}

/// Bulk writes go to extent files and their chunk values skip the WAL: killed mid-round (at
/// three points), the store reopens with every piece of the file either the last synced
/// round's bytes or the next round's, never anything else (no value naming bytes that were
/// not written, no lost synced piece).
#[test]
fn kill9_during_extent_file_writes_loses_nothing_synced() {
    if let Ok(root) = std::env::var(EXTENT_CHILD_ENV) {
        extent_child(&root);
        return;
    }
    let t = TestHost::new(DirectIo::Auto);
    let pieces = EXTENT_FILE >> 20;
    {
        let vol = open_volume(&t, "ext");
        let ino = gc_file(&vol, "f");
        for nth in 0..pieces {
            vol.write(ino, (nth << 20) as u64, &extent_piece(1, nth))
                .unwrap();
        }
        vol.fsync().unwrap();
        assert!(
            vol.tenant().db().extent_file_stats().bytes >= EXTENT_FILE as u64,
            "bulk writes not in extent files: {:?}",
            vol.tenant().db().extent_file_stats()
        );
    }
    let mut synced = 1;
    for (kill, wait_ms) in [(0, 5u64), (1, 40), (2, 120)] {
        let mut child = spawn_child(
            "kill9_during_extent_file_writes_loses_nothing_synced",
            &[
                (EXTENT_CHILD_ENV, t.root.display().to_string()),
                ("TENANTFS_TEST_EXTENT_ROUND", (synced + 1).to_string()),
            ],
        );
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut note = |line: &str| {
            if let Some((_, n)) = line.split_once("SYNCED ") {
                synced = n.parse::<u64>().unwrap();
                true
            } else {
                false
            }
        };
        for line in lines.by_ref().map_while(Result::ok) {
            if note(&line) {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        // The rounds it synced before the kill (their lines wait in the pipe).
        for line in lines.map_while(Result::ok) {
            note(&line);
        }
        let vol = open_volume(&t, "ext");
        let back = gc_read(&vol, "f", EXTENT_FILE);
        let mut newer = 0;
        for (nth, piece) in back.chunks(1 << 20).enumerate() {
            if piece == extent_piece(synced + 1, nth).as_slice() {
                newer += 1;
            } else {
                assert!(
                    piece == extent_piece(synced, nth).as_slice(),
                    "kill {kill}: piece {nth} is neither round {synced} (synced) nor the next"
                );
            }
        }
        println!("kill {kill}: round {synced} synced, {newer} pieces of the next kept");
        // The next child starts from what is on disk: all of one round again.
        let ino = vol.lookup(ROOT_INO, b"f").unwrap().ino;
        for nth in 0..pieces {
            vol.write(ino, (nth << 20) as u64, &extent_piece(synced, nth))
                .unwrap();
        }
        vol.fsync().unwrap();
    }
}
