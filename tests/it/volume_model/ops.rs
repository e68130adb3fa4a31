//! The operations a sequence is made of, and how they are drawn.

use super::*;

/// Picks an inode at run time: an index into a list of candidates; `wide` widens the list to
/// removed and forgotten inodes, so that operations on stale handles are exercised too.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pick {
    pub(super) wide: bool,
    pub(super) idx: usize,
}

/// A directory entry: an existing one (any directory, `dir.idx` chooses) or a name from the
/// pool in a picked directory.
#[derive(Clone, Copy, Debug)]
pub(super) struct Loc {
    pub(super) existing: bool,
    pub(super) dir: Pick,
    pub(super) name: usize,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum NewKind {
    File,
    Dir,
    Symlink(usize),
}

#[derive(Clone, Debug)]
pub(super) enum Op {
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

pub(super) fn pick() -> impl Strategy<Value = Pick> {
    (prop::bool::weighted(0.1), 0usize..64).prop_map(|(wide, idx)| Pick { wide, idx })
}

/// Mostly the first few inodes, so that xattr operations meet each other's attributes.
pub(super) fn xattr_pick() -> impl Strategy<Value = Pick> {
    (prop::bool::weighted(0.05), 0usize..2).prop_map(|(wide, idx)| Pick { wide, idx })
}

pub(super) fn loc() -> impl Strategy<Value = Loc> {
    (prop::bool::weighted(0.5), pick(), name_idx()).prop_map(|(existing, dir, name)| Loc {
        existing,
        dir,
        name,
    })
}

pub(super) fn name_idx() -> impl Strategy<Value = usize> {
    prop_oneof![30 => 0usize..4, 1 => Just(4usize), 1 => Just(5usize)]
}

/// Relative weights of the operation groups.
#[derive(Clone, Copy)]
pub(super) struct Profile {
    pub(super) namespace: u32,
    pub(super) data: u32,
    pub(super) xattr: u32,
}

pub(super) fn op(p: Profile) -> BoxedStrategy<Op> {
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
