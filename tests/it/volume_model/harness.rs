//! Running a sequence against the volume and the model, comparing after each step.

use super::*;

pub(super) fn errname(e: i32) -> String {
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

pub(super) type Stats = RefCell<BTreeMap<String, u64>>;

pub(super) struct Harness<'a> {
    pub(super) host: &'a TestHost,
    pub(super) tenant: String,
    pub(super) vol: Option<Volume>,
    pub(super) model: Model,
    /// The highest inode number seen in this case.
    pub(super) max_ino: u64,
    pub(super) stats: &'a Stats,
    /// What the current step is, for failure messages.
    pub(super) ctx: String,
}

impl<'a> Harness<'a> {
    pub(super) fn new(host: &'a TestHost, stats: &'a Stats) -> Self {
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
    pub(super) fn finish(mut self) {
        drop(self.vol.take());
        tenants::delete(&self.host.data, &self.tenant).unwrap();
    }

    pub(super) fn vol(&self) -> &Volume {
        self.vol.as_ref().unwrap()
    }

    pub(super) fn reopen(&mut self) {
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

    pub(super) fn count(&self, op: &str, outcome: String) {
        *self
            .stats
            .borrow_mut()
            .entry(format!("{op} -> {outcome}"))
            .or_default() += 1;
    }

    /// Both succeeded or both failed with the same errno; records the outcome.
    pub(super) fn agree<T: Debug, U: Debug>(&self, op: &str, expect: &R<T>, got: &R<U>) {
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

    pub(super) fn dirs(&self, wide: bool) -> Vec<u64> {
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

    pub(super) fn all(&self, wide: bool) -> Vec<u64> {
        let mut out: Vec<u64> = self.model.nodes.keys().copied().collect();
        if wide {
            out.extend(self.model.forgotten.keys().copied());
        }
        out
    }

    pub(super) fn files(&self, wide: bool) -> Vec<u64> {
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

    pub(super) fn choose(list: &[u64], p: Pick) -> u64 {
        list[p.idx % list.len()]
    }

    pub(super) fn pick_dir(&self, p: Pick) -> u64 {
        Self::choose(&self.dirs(p.wide), p)
    }

    pub(super) fn pick_loc(&self, l: Loc) -> (u64, Vec<u8>) {
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

    pub(super) fn pick_file(&self, p: Pick) -> u64 {
        Self::choose(&self.files(p.wide), p)
    }

    pub(super) fn pick_any(&self, p: Pick) -> u64 {
        Self::choose(&self.all(p.wide), p)
    }

    /// The attributes the volume reports for `ino` match the model.
    pub(super) fn check_attr(&self, ino: u64, attr: &Attr) {
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
    pub(super) fn check_all(&self) {
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

    pub(super) fn step(&mut self, op: &Op) {
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

    pub(super) fn create(&mut self, dir: Pick, name: usize, kind: NewKind) {
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

    pub(super) fn seek(&mut self, node: Pick, offset: u64, data: bool) {
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
