//! `tenantfs key …`: the data dir's master key.

use std::path::Path;

use anyhow::{Context, Result};

use super::{daemon_error, Cli};
use tenantfs::control::replies::MasterKeyReply;
use tenantfs::master_rotation;

/// `key rotate-master --new-key FILE`: through the daemon if one runs (it goes on under the
/// new key), else here.
pub fn rotate_master(cli: &Cli, new_key: &Path) -> Result<()> {
    let new_key = std::path::absolute(new_key)
        .with_context(|| format!("cannot resolve {}", new_key.display()))?;
    let not = "the master key was not rotated";
    let (next, made) = master_rotation::new_key_file(&new_key).context(not)?;
    if made {
        println!("made a new master key in {}", new_key.display());
    }
    let reply = match cli.live_daemon().map_err(daemon_error)? {
        Some(daemon) => {
            drop(next);
            daemon.rotate_master(&new_key).map_err(daemon_error)?
        }
        None => {
            let data = cli.open_data_dir()?;
            let done = master_rotation::rotate_master(&data, next, &new_key).map_err(|e| {
                match e {
                    // Committed: the message says so, and what finishes it.
                    master_rotation::RotationError::Unfinished { .. } => anyhow::Error::new(e),
                    e => anyhow::Error::new(e).context(not),
                }
            })?;
            MasterKeyReply {
                tenants: done.tenants as u64,
                templates: done.templates as u64,
                installed: done.installed.map(|p| p.display().to_string()),
                finished_earlier: done.finished_earlier,
                took_ms: done.took.as_millis() as u64,
            }
        }
    };
    let earlier = if reply.finished_earlier {
        " (finishing a rotation an earlier run committed)"
    } else {
        ""
    };
    println!(
        "the data dir {} is under the master key in {} now{earlier}: the keys of {} tenant(s), \
         {} base template(s) and the host's base keys were sealed under it in {} ms; the old \
         key opens nothing in it",
        cli.data_dir.display(),
        new_key.display(),
        reply.tenants,
        reply.templates,
        reply.took_ms
    );
    match &reply.installed {
        Some(at) => println!(
            "{at} holds the new key (the daemon's unit loads it from there); keep a copy of it \
             somewhere safe"
        ),
        None => println!(
            "give the new key where the old one was given (--master-key or the credential): the \
             data dir keeps no key of its own"
        ),
    }
    Ok(())
}
