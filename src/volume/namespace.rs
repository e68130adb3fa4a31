//! The namespace: looking names up, creating nodes of every kind, links, unlink and rmdir,
//! rename (with NOREPLACE and EXCHANGE) and directory listings. Every change is one write
//! batch under the volume's namespace lock, so a crash leaves it whole or absent.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::codec::*;
use super::{
    now, Attr, DirEntry, FileKind, Owner, RenameMode, Result, Volume, VolumeError, NAME_MAX,
    ROOT_INO,
};
use crate::store::Family;

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(VolumeError::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(VolumeError::NameTooLong);
    }
    Ok(())
}

impl Volume {
    fn find(&self, parent: u64, name: &[u8]) -> Result<Option<(u64, FileKind)>> {
        match self.db().get(Family::Dirents, &dirent_key(parent, name))? {
            Some(v) => Ok(Some(decode_dirent(&v).ok_or_else(|| self.damaged(parent))?)),
            None => Ok(None),
        }
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(VolumeError::NameTooLong);
        }
        match self.find(parent, name)? {
            Some((child, _)) => self.getattr(child),
            None => {
                self.dir_attr(parent)?;
                Err(VolumeError::NotFound)
            }
        }
    }

    /// Creates a node of any kind under `parent`.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        check_name(name)?;
        let _ns = self.lock_namespace();
        let _g = self.inodes.lock(parent);
        let mut pattr = self.dir_attr(parent)?;
        if pattr.nlink == 0 {
            return Err(VolumeError::NotFound); // a removed directory takes no new entries
        }
        if self.find(parent, name)?.is_some() {
            return Err(VolumeError::Exists);
        }
        let charge = self.counts.charge(0, 1)?;
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        let t = now();
        // BSD group semantics under a setgid directory.
        let setgid_dir = pattr.perm & 0o2000 != 0;
        let gid = if setgid_dir { pattr.gid } else { owner.gid };
        let mut perm = perm & 0o7777;
        if kind == FileKind::Dir && setgid_dir {
            perm |= 0o2000;
        }
        let attr = Attr {
            ino,
            kind,
            perm,
            uid: owner.uid,
            gid,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            size: target.map_or(0, |t| t.len() as u64),
            rdev,
            parent: if kind == FileKind::Dir { parent } else { 0 },
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            blocks: 0,
        };
        if kind == FileKind::Dir {
            pattr.nlink += 1;
        }
        pattr.mtime = t;
        pattr.ctime = t;
        let mut b = self.db().batch();
        self.store_attr(&mut b, &attr, target.unwrap_or_default());
        self.store_attr(&mut b, &pattr, &[]);
        b.put(
            Family::Dirents,
            &dirent_key(parent, name),
            &dirent_value(ino, kind),
        );
        self.db().write(b)?;
        charge.keep();
        Ok(attr)
    }

    /// Creates a regular file, device node, fifo or socket.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u16,
        owner: Owner,
        rdev: u32,
    ) -> Result<Attr> {
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(VolumeError::Invalid);
        }
        self.create_node(parent, name, kind, perm, owner, rdev, None)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u16, owner: Owner) -> Result<Attr> {
        self.create_node(parent, name, FileKind::Dir, perm, owner, 0, None)
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], owner: Owner) -> Result<Attr> {
        if target.is_empty() {
            return Err(VolumeError::NotFound);
        }
        if target.len() > 4095 {
            return Err(VolumeError::NameTooLong);
        }
        self.create_node(
            parent,
            name,
            FileKind::Symlink,
            0o777,
            owner,
            0,
            Some(target),
        )
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let (attr, target) = self.load(ino)?;
        if attr.kind != FileKind::Symlink {
            return Err(VolumeError::Invalid);
        }
        Ok(target)
    }

    /// Drops one link of `attr` in batch `b`; an inode left with no links becomes an orphan
    /// (its data stays until [`Self::forget`] says no one has it open).
    fn drop_link(
        &self,
        b: &mut crate::store::Batch<'_>,
        attr: &mut Attr,
        target: &[u8],
        t: SystemTime,
    ) {
        attr.nlink = if attr.kind == FileKind::Dir {
            0
        } else {
            attr.nlink.saturating_sub(1)
        };
        attr.ctime = t;
        self.store_attr(b, attr, target);
        if attr.nlink == 0 {
            b.put(Family::Meta, &orphan_key(attr.ino), b"");
        }
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(VolumeError::Invalid);
        }
        if name == b".." {
            return Err(VolumeError::NotEmpty);
        }
        self.remove(parent, name, true)
    }

    fn is_empty_dir(&self, ino: u64) -> Result<bool> {
        let (start, end) = dirent_range(ino);
        let mut empty = true;
        self.db().range(Family::Dirents, &start, &end, |_, _| {
            empty = false;
            false
        })?;
        Ok(empty)
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(VolumeError::NameTooLong);
        }
        let _ns = self.lock_namespace();
        self.dir_attr(parent)?;
        let (child, kind) = self.find(parent, name)?.ok_or(VolumeError::NotFound)?;
        let _g = self.inodes.lock_many(&[parent, child]);
        // Read under the lock: a setattr on the parent meanwhile must not be overwritten.
        let mut pattr = self.dir_attr(parent)?;
        match (dir, kind == FileKind::Dir) {
            (false, true) => return Err(VolumeError::IsDir),
            (true, false) => return Err(VolumeError::NotDir),
            (true, true) if !self.is_empty_dir(child)? => return Err(VolumeError::NotEmpty),
            _ => {}
        }
        let (mut cattr, target) = self.load(child)?;
        let t = now();
        let mut b = self.db().batch();
        b.delete(Family::Dirents, &dirent_key(parent, name));
        self.drop_link(&mut b, &mut cattr, &target, t);
        if dir {
            pattr.nlink = pattr.nlink.saturating_sub(1);
        }
        pattr.mtime = t;
        pattr.ctime = t;
        self.store_attr(&mut b, &pattr, &[]);
        self.db().write(b)?;
        Ok(())
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        check_name(newname)?;
        let _ns = self.lock_namespace();
        let _g = self.inodes.lock_many(&[ino, newparent]);
        let mut pattr = self.dir_attr(newparent)?;
        if pattr.nlink == 0 {
            return Err(VolumeError::NotFound); // a removed directory takes no new entries
        }
        // Linux's order: an existing target first, then what is wrong with the source.
        if self.find(newparent, newname)?.is_some() {
            return Err(VolumeError::Exists);
        }
        let (mut attr, target) = self.load(ino)?;
        if attr.kind == FileKind::Dir {
            return Err(VolumeError::NotPermitted);
        }
        if attr.nlink == 0 {
            return Err(VolumeError::NotFound);
        }
        let t = now();
        attr.nlink += 1;
        attr.ctime = t;
        pattr.mtime = t;
        pattr.ctime = t;
        let mut b = self.db().batch();
        self.store_attr(&mut b, &attr, &target);
        self.store_attr(&mut b, &pattr, &[]);
        b.put(
            Family::Dirents,
            &dirent_key(newparent, newname),
            &dirent_value(ino, attr.kind),
        );
        self.db().write(b)?;
        Ok(attr)
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_within(&self, dir: u64, ancestor: u64) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = self.getattr(cur)?.parent;
        }
        Err(self.damaged(dir))
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        mode: RenameMode,
    ) -> Result<()> {
        if name.len() > NAME_MAX || newname.len() > NAME_MAX {
            return Err(VolumeError::NameTooLong);
        }
        check_name(newname)?;
        let _ns = self.lock_namespace();
        let (src, skind) = self
            .find(parent, name)?
            .ok_or_else(|| match self.dir_attr(parent) {
                Err(e) => e,
                Ok(_) => VolumeError::NotFound,
            })?;
        if self.dir_attr(newparent)?.nlink == 0 {
            return Err(VolumeError::NotFound); // a removed directory takes no new entries
        }
        let dst = self.find(newparent, newname)?;
        if mode == RenameMode::NoReplace && dst.is_some() {
            return Err(VolumeError::Exists);
        }
        if mode == RenameMode::Exchange && dst.is_none() {
            return Err(VolumeError::NotFound);
        }
        if let Some((d, _)) = dst {
            if d == src {
                return Ok(()); // same inode: nothing to do (POSIX)
            }
        }
        // A directory cannot move into its own subtree (for exchange: either way round).
        if skind == FileKind::Dir && parent != newparent && self.is_within(newparent, src)? {
            return Err(VolumeError::Invalid);
        }
        // Nor can the target be an ancestor of the source: Linux says ENOTEMPTY (EINVAL for
        // exchange) before looking at the source's type.
        if let Some((d, FileKind::Dir)) = dst {
            if parent != newparent && self.is_within(parent, d)? {
                return Err(match mode {
                    RenameMode::Exchange => VolumeError::Invalid,
                    _ => VolumeError::NotEmpty,
                });
            }
        }
        let mut involved = vec![parent, newparent, src];
        if let Some((d, _)) = dst {
            involved.push(d);
        }
        let _g = self.inodes.lock_many(&involved);
        let t = now();
        let mut b = self.db().batch();
        let (mut sattr, starget) = self.load(src)?;

        if mode == RenameMode::Exchange {
            let (d, dkind) = dst.expect("checked above");
            let (mut dattr, dtarget) = self.load(d)?;
            b.put(
                Family::Dirents,
                &dirent_key(parent, name),
                &dirent_value(d, dkind),
            );
            b.put(
                Family::Dirents,
                &dirent_key(newparent, newname),
                &dirent_value(src, skind),
            );
            if parent != newparent {
                let mut pa = self.getattr(parent)?;
                let mut npa = self.getattr(newparent)?;
                if skind == FileKind::Dir {
                    sattr.parent = newparent;
                    pa.nlink -= 1;
                    npa.nlink += 1;
                }
                if dkind == FileKind::Dir {
                    dattr.parent = parent;
                    npa.nlink -= 1;
                    pa.nlink += 1;
                }
                pa.mtime = t;
                pa.ctime = t;
                npa.mtime = t;
                npa.ctime = t;
                self.store_attr(&mut b, &pa, &[]);
                self.store_attr(&mut b, &npa, &[]);
            } else {
                let mut pa = self.getattr(parent)?;
                pa.mtime = t;
                pa.ctime = t;
                self.store_attr(&mut b, &pa, &[]);
            }
            sattr.ctime = t;
            dattr.ctime = t;
            self.store_attr(&mut b, &sattr, &starget);
            self.store_attr(&mut b, &dattr, &dtarget);
            self.db().write(b)?;
            return Ok(());
        }

        let mut pa = self.getattr(parent)?;
        let mut npa_separate = (parent != newparent)
            .then(|| self.getattr(newparent))
            .transpose()?;
        if let Some((d, dkind)) = dst {
            match (skind == FileKind::Dir, dkind == FileKind::Dir) {
                (true, false) => return Err(VolumeError::NotDir),
                (false, true) => return Err(VolumeError::IsDir),
                (true, true) if !self.is_empty_dir(d)? => return Err(VolumeError::NotEmpty),
                _ => {}
            }
            let (mut dattr, dtarget) = self.load(d)?;
            self.drop_link(&mut b, &mut dattr, &dtarget, t);
            if dkind == FileKind::Dir {
                // The replaced directory's ".." no longer links the new parent.
                match npa_separate.as_mut() {
                    Some(npa) => npa.nlink -= 1,
                    None => pa.nlink -= 1,
                }
            }
        }
        b.delete(Family::Dirents, &dirent_key(parent, name));
        b.put(
            Family::Dirents,
            &dirent_key(newparent, newname),
            &dirent_value(src, skind),
        );
        if skind == FileKind::Dir && parent != newparent {
            sattr.parent = newparent;
            pa.nlink -= 1;
            if let Some(npa) = npa_separate.as_mut() {
                npa.nlink += 1;
            }
        }
        sattr.ctime = t;
        self.store_attr(&mut b, &sattr, &starget);
        pa.mtime = t;
        pa.ctime = t;
        self.store_attr(&mut b, &pa, &[]);
        if let Some(mut npa) = npa_separate {
            npa.mtime = t;
            npa.ctime = t;
            self.store_attr(&mut b, &npa, &[]);
        }
        self.db().write(b)?;
        Ok(())
    }

    /// The entries of a directory, sorted by name (without "." and "..").
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        self.dir_attr(ino)?;
        let (start, end) = dirent_range(ino);
        let mut out = Vec::new();
        let mut bad = false;
        self.db().range(Family::Dirents, &start, &end, |k, v| {
            match decode_dirent(v) {
                Some((child, kind)) => out.push(DirEntry {
                    name: k[8..].to_vec(),
                    ino: child,
                    kind,
                }),
                None => bad = true,
            }
            true
        })?;
        if bad {
            return Err(self.damaged(ino));
        }
        Ok(out)
    }
}
