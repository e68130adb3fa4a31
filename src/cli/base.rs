//! Shared base images: `base import|list|verify|delete|gc`.

use std::path::Path;

use anyhow::{Context, Result};
use tenantfs::base::{BaseStore, Progress};
use tenantfs::units::ByteSize;

use super::{command_stores, print_json, Cli};

fn open_store(cli: &Cli) -> Result<BaseStore> {
    let config = cli.load_config()?;
    let data = cli.open_data_dir()?;
    Ok(BaseStore::open(&data, &command_stores(&config))?)
}

pub fn import(cli: &Cli, name: &str, source: &Path, block_size: ByteSize) -> Result<()> {
    let store = open_store(cli)?;
    let bs = u32::try_from(block_size.0).unwrap_or(0);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    let mut show = |p: Progress| {
        if tty && p.total_bytes > 0 {
            eprint!(
                "\rimporting {name}: {:>3}% ({} of {} MiB)",
                p.done_bytes * 100 / p.total_bytes,
                p.done_bytes >> 20,
                p.total_bytes >> 20
            );
        }
    };
    let info = store
        .import(name, source, bs, &mut show)
        .with_context(|| format!("cannot import base {name}"))?;
    if tty {
        eprintln!();
    }
    println!(
        "imported base {} from {}: {} entries, {} logical, {} unique, in {:.1} s",
        info.name,
        source.display(),
        info.files,
        ByteSize(info.logical_bytes),
        ByteSize(info.unique_bytes),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn list(cli: &Cli, json: bool) -> Result<()> {
    let store = open_store(cli)?;
    let list = store.list()?;
    if json {
        return print_json(&list);
    }
    println!(
        "{:<24} {:>6} {:>8} {:>14} {:>14} {:>14} {:>8}",
        "NAME", "KIND", "FILES", "LOGICAL", "UNIQUE", "STORED", "TENANTS"
    );
    for b in &list.bases {
        println!(
            "{:<24} {:>6} {:>8} {:>14} {:>14} {:>14} {:>8}",
            b.name,
            format!("{:?}", b.kind).to_lowercase(),
            b.files,
            b.logical_bytes,
            b.unique_bytes,
            b.stored_bytes,
            b.tenants.len()
        );
    }
    println!(
        "LOGICAL: file sizes; UNIQUE: file bytes left after holes and duplicate blocks; \
         STORED: its distinct blocks, whole, on disk"
    );
    println!(
        "host: {} logical, {} stored, {} in packs",
        list.host.logical_bytes, list.host.stored_bytes, list.host.pack_bytes
    );
    Ok(())
}

pub fn verify(cli: &Cli) -> Result<()> {
    let store = open_store(cli)?;
    let r = store.verify()?;
    for b in &r.bad {
        eprintln!("damaged: {b}");
    }
    if !r.is_clean() {
        anyhow::bail!(
            "{} of {} blocks damaged, {} block references without a block; restore the data dir from a backup",
            r.bad.len(),
            r.blocks,
            r.missing
        );
    }
    println!("verified {} blocks: all intact", r.blocks);
    Ok(())
}

pub fn delete(cli: &Cli, name: &str) -> Result<()> {
    let store = open_store(cli)?;
    store.delete(name)?;
    println!("deleted base {name}; run `tenantfs base gc` to reclaim its disk space");
    Ok(())
}

pub fn gc(cli: &Cli) -> Result<()> {
    let store = open_store(cli)?;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let r = store.gc(&mut |p: Progress| {
        if tty && p.total_bytes > 0 {
            eprint!("\rbase gc: pack {} of {}", p.done_bytes, p.total_bytes);
        }
    })?;
    if tty {
        eprintln!();
    }
    println!(
        "base gc: {} packs, {} live blocks, {} garbage slots, {} packs deleted, {} reclaimed",
        r.packs,
        r.live_blocks,
        r.garbage_slots,
        r.packs_deleted,
        ByteSize(r.reclaimed_bytes)
    );
    Ok(())
}
