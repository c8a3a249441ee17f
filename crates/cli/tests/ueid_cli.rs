//! `smc ueid add|del|show` against a private UEID file: the file is what
//! `Stack::global()` reads (SMC_RS_UEID_FILE), invalid and duplicate UEIDs are refused,
//! and `show` says which UEIDs are in effect (the environment wins over the file).

use std::process::{Command, Output};

fn smc(file: &std::path::Path, args: &[&str], env_ueid: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_smc"));
    c.arg("ueid").arg("--file").arg(file).args(args);
    c.env_remove("SMC_RS_UEID").env_remove("SMC_RS_UEID_FILE");
    if let Some(v) = env_ueid {
        c.env("SMC_RS_UEID", v);
    }
    c.output().expect("run smc")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn add_del_show() {
    let dir = std::env::temp_dir().join(format!("smc-ueid-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let file = dir.join("etc").join("ueid");

    let o = smc(&file, &["show"], None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("in effect: none"), "{}", text(&o));

    assert!(smc(&file, &["add", "SMC-RS-KPEER"], None).status.success());
    assert!(smc(&file, &["add", "SECOND.ONE"], None).status.success());
    let o = smc(&file, &["add", "SMC-RS-KPEER"], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("already configured"), "{}", text(&o));
    let o = smc(&file, &["add", "lower-case"], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("invalid UEID"), "{}", text(&o));

    // The file is the runtime's configuration.
    let t = smc::clc::UeidTable::load(&file).expect("load");
    let names: Vec<String> = t.iter().map(|u| u.to_string()).collect();
    assert_eq!(names, ["SMC-RS-KPEER", "SECOND.ONE"]);

    let o = smc(&file, &["show"], None);
    assert!(
        text(&o).contains("  SMC-RS-KPEER\n  SECOND.ONE\n"),
        "{}",
        text(&o)
    );
    let o = smc(&file, &["show"], Some("FROM-ENV"));
    assert!(
        text(&o).contains("from SMC_RS_UEID") && text(&o).contains("  FROM-ENV"),
        "{}",
        text(&o)
    );

    assert!(smc(&file, &["del", "SMC-RS-KPEER"], None).status.success());
    let o = smc(&file, &["del", "SMC-RS-KPEER"], None);
    assert!(!o.status.success());
    assert!(text(&o).contains("not configured"), "{}", text(&o));
    assert_eq!(smc::clc::UeidTable::load(&file).expect("load").len(), 1);
    assert!(smc(&file, &["del", "--all"], None).status.success());
    assert!(smc::clc::UeidTable::load(&file).expect("load").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
