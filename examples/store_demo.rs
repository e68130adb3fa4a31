//! Demo: write records into a tenant's encrypted store, read them back, and show they are not
//! on disk in the clear. Used by `make demo` (examples/demo.sh) after `tenantfs init` and
//! `tenantfs tenant create`.
//!
//! usage: store_demo DATA_DIR TENANT

use anyhow::{bail, Context, Result};
use tenantfs::config::Config;
use tenantfs::data_dir::DataDir;
use tenantfs::store::Family;
use tenantfs::tenants;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data_dir, tenant] = args.as_slice() else {
        bail!("usage: store_demo DATA_DIR TENANT");
    };
    let data = DataDir::open(data_dir.as_ref(), None)?;
    let host = Config::default().store_host();
    let t = tenants::open(&data, &host, tenant).context("open tenant")?;
    let db = t.db();
    println!(
        "opened tenant {tenant}: direct I/O {}",
        if db.direct_io() {
            "on"
        } else {
            "off (fallback)"
        }
    );
    let n = 20_000u32;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut batch = db.batch();
        for i in chunk {
            let value = format!("hello from tenant {tenant}, record {i:05} ").repeat(8);
            batch.put(
                Family::Extents,
                format!("rec/{i:05}").as_bytes(),
                value.as_bytes(),
            );
        }
        db.write(batch)?;
    }
    db.sync()?;
    db.flush()?;
    println!(
        "wrote {n} records (~{} KiB) in atomic batches, synced and flushed",
        n * 300 / 1024
    );
    let mut checked = 0;
    for i in (0..n).step_by(97) {
        let want = format!("hello from tenant {tenant}, record {i:05} ").repeat(8);
        let got = db.get(Family::Extents, format!("rec/{i:05}").as_bytes())?;
        if got.as_deref() != Some(want.as_bytes()) {
            bail!("record {i} read back wrong");
        }
        checked += 1;
    }
    println!("read back {checked} records: all match");
    let first = db.scan(Family::Extents, b"rec/", 1)?;
    if let Some((k, v)) = first.first() {
        println!(
            "first record: {} = {}...",
            String::from_utf8_lossy(k),
            String::from_utf8_lossy(&v[..40])
        );
    }
    Ok(())
}
