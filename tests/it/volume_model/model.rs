//! The reference model: what the volume should answer, following Linux; and the few names
//! and values the operations draw from, few so that operations meet each other's results.

use super::*;

/// Entry names: four short ones, the longest allowed and one too long.
pub(super) fn entry_name(i: usize) -> Vec<u8> {
    match i {
        0..=3 => vec![b'a' + i as u8],
        4 => vec![b'm'; 255],
        _ => vec![b'n'; 256],
    }
}

/// Symlink targets: short ones, the longest allowed, one too long, and the empty one.
pub(super) fn link_target(i: usize) -> Vec<u8> {
    match i {
        0 => b"a".to_vec(),
        1 => b"../b/c".to_vec(),
        2 => vec![b't'; 4095],
        3 => vec![b't'; 4096],
        _ => Vec::new(),
    }
}

pub(super) fn xattr_name(i: usize) -> Vec<u8> {
    format!("user.{}", ["a", "b", "c"][i % 3]).into_bytes()
}

// ---------------------------------------------------------------------------------------------
// The reference model.

#[derive(Clone, Debug)]
pub(super) enum Body {
    File(Vec<u8>),
    Dir {
        entries: BTreeMap<Vec<u8>, u64>,
        parent: u64,
    },
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) body: Body,
    /// Directory entries naming the node (for a directory: 1 while linked, 0 once removed).
    pub(super) links: u32,
    pub(super) perm: u16,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Node {
    pub(super) fn new(body: Body, perm: u16) -> Self {
        Node {
            body,
            links: 1,
            perm,
            uid: OWNER.uid,
            gid: OWNER.gid,
            xattrs: BTreeMap::new(),
        }
    }

    pub(super) fn kind(&self) -> FileKind {
        match self.body {
            Body::File(_) => FileKind::File,
            Body::Dir { .. } => FileKind::Dir,
            Body::Symlink(_) => FileKind::Symlink,
        }
    }

    pub(super) fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir { .. })
    }
}

/// Every inode the test may still name: linked ones, orphans (no links, still "open"), and
/// inodes freed by forget in this session (their numbers are not reused before a reopen).
pub(super) struct Model {
    pub(super) nodes: BTreeMap<u64, Node>,
    pub(super) forgotten: BTreeMap<u64, FileKind>,
}

impl Model {
    pub(super) fn new() -> Self {
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

    pub(super) fn node(&self, ino: u64) -> R<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    pub(super) fn node_mut(&mut self, ino: u64) -> &mut Node {
        self.nodes.get_mut(&ino).expect("model node")
    }

    pub(super) fn entries(&self, dir: u64) -> R<&BTreeMap<Vec<u8>, u64>> {
        match &self.node(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(libc::ENOTDIR),
        }
    }

    pub(super) fn entries_mut(&mut self, dir: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.node_mut(dir).body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    /// A directory that can take new entries (a removed one cannot: ENOENT).
    pub(super) fn live_dir(&self, dir: u64) -> R<&BTreeMap<Vec<u8>, u64>> {
        let entries = self.entries(dir)?;
        if self.nodes[&dir].links == 0 {
            return Err(libc::ENOENT);
        }
        Ok(entries)
    }

    pub(super) fn parent_of(&self, dir: u64) -> u64 {
        match self.nodes[&dir].body {
            Body::Dir { parent, .. } => parent,
            _ => panic!("model: {dir} is not a directory"),
        }
    }

    pub(super) fn set_parent(&mut self, dir: u64, new: u64) {
        if let Body::Dir { parent, .. } = &mut self.node_mut(dir).body {
            *parent = new;
        }
    }

    pub(super) fn nlink(&self, ino: u64) -> u32 {
        let n = &self.nodes[&ino];
        match &n.body {
            Body::Dir { entries, .. } if n.links > 0 => {
                2 + entries.values().filter(|c| self.nodes[c].is_dir()).count() as u32
            }
            _ => n.links,
        }
    }

    pub(super) fn size(&self, ino: u64) -> u64 {
        match &self.nodes[&ino].body {
            Body::File(d) => d.len() as u64,
            Body::Dir { .. } => 0,
            Body::Symlink(t) => t.len() as u64,
        }
    }

    /// Whether directory `dir` is `ancestor` or lies below it.
    pub(super) fn is_within(&self, dir: u64, ancestor: u64) -> bool {
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

    pub(super) fn check_name(name: &[u8]) -> R<()> {
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        Ok(())
    }

    /// Whether `name` can be created in `parent` (mknod, mkdir, symlink).
    pub(super) fn check_create(&self, parent: u64, name: &[u8]) -> R<()> {
        Self::check_name(name)?;
        if self.live_dir(parent)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    pub(super) fn add(&mut self, parent: u64, name: &[u8], ino: u64, node: Node) {
        self.nodes.insert(ino, node);
        self.entries_mut(parent).insert(name.to_vec(), ino);
    }

    pub(super) fn drop_link(&mut self, ino: u64) {
        let n = self.node_mut(ino);
        n.links = if n.is_dir() { 0 } else { n.links - 1 };
    }

    pub(super) fn lookup(&self, parent: u64, name: &[u8]) -> R<u64> {
        Self::check_name(name)?;
        self.entries(parent)?.get(name).copied().ok_or(libc::ENOENT)
    }

    pub(super) fn remove(&mut self, parent: u64, name: &[u8], dir: bool) -> R<()> {
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

    pub(super) fn link(&mut self, ino: u64, newparent: u64, newname: &[u8]) -> R<()> {
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
    pub(super) fn rename(
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

    pub(super) fn file_mut(&mut self, ino: u64, symlink_err: i32) -> R<&mut Vec<u8>> {
        match &mut self.nodes.get_mut(&ino).ok_or(libc::ENOENT)?.body {
            Body::File(d) => Ok(d),
            Body::Dir { .. } => Err(libc::EISDIR),
            Body::Symlink(_) => Err(symlink_err),
        }
    }

    pub(super) fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> R<u32> {
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

    pub(super) fn read(&mut self, ino: u64, offset: u64, len: u32) -> R<Vec<u8>> {
        let file = self.file_mut(ino, libc::EINVAL)?;
        let start = (offset as usize).min(file.len());
        let end = (offset as usize + len as usize).min(file.len());
        Ok(file[start..end].to_vec())
    }

    pub(super) fn truncate(&mut self, ino: u64, size: u64) -> R<()> {
        self.file_mut(ino, libc::EINVAL)?.resize(size as usize, 0);
        Ok(())
    }

    pub(super) fn fallocate(&mut self, ino: u64, offset: u64, len: u64, mode: Fallocate) -> R<()> {
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

    pub(super) fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(libc::EINVAL),
        }
    }

    pub(super) fn setxattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> R<()> {
        let xattrs = &mut self.nodes.get_mut(&ino).ok_or(libc::ENOENT)?.xattrs;
        match (mode, xattrs.contains_key(name)) {
            (XattrMode::Create, true) => return Err(libc::EEXIST),
            (XattrMode::Replace, false) => return Err(libc::ENODATA),
            _ => {}
        }
        xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    pub(super) fn getxattr(&self, ino: u64, name: &[u8]) -> R<Vec<u8>> {
        self.node(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(libc::ENODATA)
    }

    pub(super) fn removexattr(&mut self, ino: u64, name: &[u8]) -> R<()> {
        let xattrs = &mut self.nodes.get_mut(&ino).ok_or(libc::ENOENT)?.xattrs;
        xattrs.remove(name).map(|_| ()).ok_or(libc::ENODATA)
    }

    pub(super) fn listxattr(&self, ino: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for name in self.nodes[&ino].xattrs.keys() {
            out.extend_from_slice(name);
            out.push(0);
        }
        out
    }

    /// The kernel dropped its last reference: an inode without links is freed.
    pub(super) fn forget(&mut self, ino: u64) {
        if self.nodes.contains_key(&ino) && self.nlink(ino) == 0 {
            let n = self.nodes.remove(&ino).unwrap();
            self.forgotten.insert(ino, n.kind());
        }
    }

    /// A new session: every orphan is gone, inode numbers may be reused.
    pub(super) fn reopen(&mut self) -> Vec<u64> {
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
