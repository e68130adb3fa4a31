//! A tenant store for the volume's unit tests (and the FUSE operations' ones): one place
//! that builds a data dir, a store host and a tenant.

/// A fresh tenant in a temporary data dir, whose volume tests open (and open again).
pub(crate) struct TestStore {
    _tmp: tempfile::TempDir,
    data: crate::data_dir::DataDir,
    host: crate::store::StoreHost,
}

impl TestStore {
    pub(crate) fn new() -> Self {
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let root = tmp.path().join("data");
        crate::data_dir::DataDir::init(&root, None).unwrap();
        let data = crate::data_dir::DataDir::open(&root, None).unwrap();
        let host = crate::store::StoreHost::builder()
            .block_cache_bytes(8 << 20)
            .build();
        crate::tenants::create(&data, &host, "t", None).unwrap();
        Self {
            _tmp: tmp,
            data,
            host,
        }
    }

    pub(crate) fn open(&self) -> super::Volume {
        super::Volume::open(crate::tenants::open(&self.data, &self.host, "t").unwrap()).unwrap()
    }
}
