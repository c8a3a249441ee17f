//! The provider-independent conformance suite (`smc_verbs::conformance`, also run on
//! Linux rxe through libibverbs by tests/system/ibverbs-rxe.sh) on two software devices
//! and within one device.

use smc_softroce::{open_device, Config};

#[test]
fn suite_between_two_devices() {
    let a = open_device("127.86.201.1".parse().unwrap(), &Config::default()).unwrap();
    let b = open_device("127.86.201.2".parse().unwrap(), &Config::default()).unwrap();
    let failed: Vec<String> = smc_verbs::conformance::run_all(&a, &b)
        .into_iter()
        .filter_map(|(n, r)| r.err().map(|e| format!("{n}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn suite_within_one_device() {
    let a = open_device("127.86.202.1".parse().unwrap(), &Config::default()).unwrap();
    let failed: Vec<String> = smc_verbs::conformance::run_all(&a, &a)
        .into_iter()
        .filter_map(|(n, r)| r.err().map(|e| format!("{n}: {e}")))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}
