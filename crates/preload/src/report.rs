//! `SMC_RS_STATS=PATH`: one line per SMC event of the process, appended to PATH (one
//! `write` per line with O_APPEND, so several processes can share the file):
//!
//! ```text
//! pid=4242 listen local=127.0.0.2:8000 mode=SMC
//! pid=4242 accept local=127.0.0.2:8000 peer=127.0.0.1:50312 mode=SMC-R info="SMC-Rv1 on lgr1 (first contact)"
//! pid=4242 close local=127.0.0.2:8000 peer=127.0.0.1:50312 mode=SMC-R sent=20971520 received=84
//! pid=4243 connect peer=127.0.0.3:9000 mode=TCP info="SMC-R not negotiated: ..."
//! ```
//!
//! The same lines go to tracing (`SMC_LOG=info`).

use std::fmt;
use std::io::Write;
use std::sync::OnceLock;

fn path() -> Option<&'static str> {
    static P: OnceLock<Option<String>> = OnceLock::new();
    P.get_or_init(|| smc_verbs::process::config_var("SMC_RS_STATS").filter(|p| !p.is_empty()))
        .as_deref()
}

/// Reports one event.
pub(crate) fn line(args: fmt::Arguments<'_>) {
    let text = format!("pid={} {args}\n", std::process::id());
    tracing::info!(target: "smc_preload", "{}", text.trim_end());
    if let Some(p) = path() {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = f.write_all(text.as_bytes());
        }
    }
}
