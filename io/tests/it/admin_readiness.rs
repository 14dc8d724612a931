//! `/readyz` is answered from the cold thread's periodic probe: with the cold thread stuck and
//! its queue full, readiness checks still answer at once and queue nothing, so a flood of them
//! cannot take the queue slots that admin writes need. On both record stores.

use crate::store_backends;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use sortie_core::config::Config;
use sortie_core::snapshot::{decode_snapshot, DEFAULT_SNAPSHOT_JSON};
use sortie_core::worker::WorkerRegistry;
use sortie_io::control::state::ControlState;
use sortie_io::ingress::admin::{handle, AdminContext, AdminRequest};
use sortie_io::store::{ColdHandle, ColdThread};
use sortie_io::tokens::Authenticator;
use store_backends::Backend;

const DEADLINE: Duration = Duration::from_secs(30);

fn context(store: ColdHandle) -> AdminContext {
    let mut json = DEFAULT_SNAPSHOT_JSON.as_bytes().to_vec();
    let snapshot = decode_snapshot(&mut json).expect("default snapshot");
    let state = ControlState::new(
        &Config::default(),
        Authenticator::new(&[]),
        "admin-token".into(),
        WorkerRegistry::new(),
        1,
        Arc::new(snapshot),
    );
    AdminContext::new(Arc::new(state), store, Arc::new(String::new))
}

fn get(path: &str) -> AdminRequest<'_> {
    AdminRequest {
        method: "GET",
        path,
        authorization: None,
        if_match: None,
        actor: None,
        body: Vec::new(),
    }
}

fn block_on<F: Future>(fut: F) -> F::Output {
    let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio runtime");
    rt.block_on(async {
        match monoio::time::timeout(DEADLINE, fut).await {
            Ok(out) => out,
            Err(_) => panic!("no answer within {DEADLINE:?}"),
        }
    })
}

on_both_backends!(readiness_is_answered_without_the_cold_queue);

fn readiness_is_answered_without_the_cold_queue(b: &dyn Backend) {
    let mut store = b.open();
    store
        .bootstrap(DEFAULT_SNAPSHOT_JSON, "2026-01-01T00:00:00Z")
        .expect("bootstrap");
    let (cold, join) = ColdThread::start_with_capacity(store, 1).expect("start");
    // One round trip: the thread has run its first probe.
    cold.call_blocking(|_| Ok(())).expect("cold thread answers");
    let ctx = context(cold.clone());

    // Hold the cold thread inside a job, then take the one queue slot.
    let (entered_tx, entered_rx) = crossbeam_channel::bounded(1);
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(1);
    let holder = cold.clone();
    let held = std::thread::spawn(move || {
        holder.call_blocking(move |_| {
            let _ = entered_tx.send(());
            let _ = release_rx.recv();
            Ok(())
        })
    });
    entered_rx
        .recv_timeout(DEADLINE)
        .expect("the cold thread runs the holding job");

    block_on(async {
        let mut queued = pin!(cold.latest_config());
        assert!(queued
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        for _ in 0..200 {
            let answer = handle(&ctx, get("/readyz")).await;
            assert_eq!(
                answer.status,
                200,
                "{}",
                String::from_utf8_lossy(&answer.body)
            );
            assert_eq!(answer.body, b"ready\n");
        }
        drop(release_tx);
        let latest = queued.await.expect("the queued call is still served");
        assert_eq!(latest.map(|r| r.revision), Some(1));
    });
    assert_eq!(held.join().expect("holder"), Ok(()));
    drop(ctx);
    drop(cold);
    join.join().expect("cold thread stops");
}
