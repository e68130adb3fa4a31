//! The cache requests, answered by a process that owns a [`HostCache`] (and its governor).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::cache::{process_rss_bytes, HostCache};
use crate::pressure::Governor;

use super::protocol::{Request, Response};
use super::server::Handler;

/// A handler for the `cache_*` requests; `what` names the server in answers (e.g. the tenant).
pub fn cache_handler(
    cache: Arc<HostCache>,
    governor: Option<Arc<Governor>>,
    what: String,
) -> Handler {
    Arc::new(move |req| match req {
        Request::CacheStats => Response::ok(stats(&cache, governor.as_deref(), &what)),
        Request::CacheRelease { bytes } => {
            let rss_before = process_rss_bytes().ok();
            let released = cache.release(bytes);
            // Evicted entries free malloc'd metadata too: hand glibc's free pages back as well.
            crate::cache::malloc::give_back_free_heap();
            Response::ok(json!({
                "server": what,
                "pid": std::process::id(),
                "requested_bytes": bytes,
                "released_bytes": released,
                "rss_before_bytes": rss_before,
                "rss_after_bytes": process_rss_bytes().ok(),
            }))
        }
        Request::CacheBudget { bytes } => {
            match &governor {
                Some(g) => g.set_ceiling(bytes),
                None => cache.set_budget(bytes),
            }
            tracing::info!(bytes, "cache budget set by the operator");
            Response::ok(stats(&cache, governor.as_deref(), &what))
        }
        Request::Mount { .. } | Request::Umount { .. } | Request::Stats | Request::TenantList => {
            Response::err(
                "this process serves one mount; mounts and host stats are the daemon's \
             (start it with `tenantfs daemon`)",
            )
        }
    })
}

fn stats(cache: &HostCache, governor: Option<&Governor>, what: &str) -> Value {
    let mut v = serde_json::to_value(cache.stats()).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("server".into(), json!(what));
        m.insert("pid".into(), json!(std::process::id()));
        m.insert("process_rss_bytes".into(), json!(process_rss_bytes().ok()));
        m.insert(
            "ceiling_bytes".into(),
            json!(governor.map_or(cache.budget(), Governor::ceiling)),
        );
        m.insert("governor".into(), json!(governor.map(Governor::stats)));
    }
    v
}
