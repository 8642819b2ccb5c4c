//! The API's answers, a task of their own beside the event loop: a question is taken as it
//! comes (not at a tick of the reader's), what reads /proc is done on the answers' thread of
//! the slow side ([`Worker`]), and each step between reads only what the run holds,
//! borrowing it for that step alone. The task runs on the reader's thread only when a
//! question or a read's result wakes it (and, at the start, while a question waits for the
//! `-- CMD` gateway's fork record): the event loop polls nothing for it (a receiver polled at
//! each wake-up of a fork storm cost the reader some 8%).
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc::Receiver, oneshot};

use super::pipeline::Pipeline;
use super::worker::Worker;
use crate::api::{Answer, Asked, Query};

/// Answers the questions `queries` brings, one at a time, until the run drops this task or
/// the servers close.
pub(super) async fn answer_all(
    run: Rc<RefCell<Pipeline>>,
    mut queries: Receiver<Query>,
    slow: Worker,
) {
    let mut sizes = Sizes::default();
    while let Some(query) = queries.recv().await {
        if query.asked.names_a_process() {
            command_gateway_taken(&run).await;
        }
        answer(&run, &slow, &mut sizes, query).await;
    }
}

/// How long the last answer to each question about every process was: the next is written
/// into a buffer that size, not grown to it (a `sessions` of 10,000 sessions is 1.4 MB:
/// growing to it reallocated it some fourteen times, on the reader's thread). By kind, not
/// by filter: a small answer after a large one takes a buffer of the large one's size,
/// freed once it is sent.
#[derive(Default)]
struct Sizes {
    sessions: usize,
    tree: usize,
}

/// `ready` names the `-- CMD` gateway before the event loop took the record of its fork from
/// the ring: a question that names a process, asked meanwhile, waits until the event loop
/// took it, so that no answer says a gateway `ready` named is not tracked. A wait of a few
/// milliseconds at the start (see [`Pipeline::awaits_command_gateway`]).
async fn command_gateway_taken(run: &RefCell<Pipeline>) {
    while run.borrow().awaits_command_gateway() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn answer(run: &RefCell<Pipeline>, slow: &Worker, sizes: &mut Sizes, query: Query) {
    let reply = query.reply;
    // A borrow of the run never lives across an await (the event loop's next borrow would
    // panic): no expression that borrows it awaits.
    match query.asked {
        Asked::Status => send_json(reply, &run.borrow().status(), &mut 0),
        Asked::Kinds => send_json(reply, &run.borrow().kinds(), &mut 0),
        Asked::Sessions(filter) => {
            let sessions = run.borrow().sessions(&filter);
            match sessions {
                Some(sessions) => send_json(reply, &sessions, &mut sizes.sessions),
                None => refuse(reply),
            }
        }
        Asked::Tree(filter) => {
            let tree = run.borrow().tree(&filter);
            match tree {
                Some(tree) => send_json(reply, &tree, &mut sizes.tree),
                None => refuse(reply),
            }
        }
        Asked::Follow { filter, lines } => {
            let followed = run.borrow_mut().follow(&filter, lines);
            let _ = reply.send(followed.then(Vec::new));
        }
        Asked::Kill { request, asked_by } => {
            let answer = run.borrow_mut().kill_asked(&request, asked_by);
            send_json(reply, &answer, &mut 0);
        }
        Asked::Process(pid) => match process(run, slow, pid).await {
            Some(process) => send_json(reply, &process, &mut 0),
            None => refuse(reply),
        },
    }
}

/// `why PID`: the process as the graph knows it, sampled on the slow side, who may hold its
/// channels' other ends taken from the run, their fds read on the slow side, its spawn site
/// named on the slow side, then the answer built from the run.
async fn process(run: &RefCell<Pipeline>, slow: &Worker, pid: u32) -> Option<crate::api::Process> {
    let asked = run.borrow().asked(pid)?;
    let mut evidence = None;
    if let Some((process, before)) = asked.to_sample {
        let sampled = slow.run(move |lookout| {
            let sample = lookout.sample(process, before.as_deref());
            (sample, lookout.take_notes())
        });
        let (sample, notes) = sampled.await.unwrap_or_default();
        // A note that cannot be written is the outlet's to report, not this answer's.
        let _ = run.borrow_mut().tell(&notes);
        if let Some(mut sample) = sample {
            let near = run.borrow().near(asked.id, &mut sample);
            let id = asked.id;
            evidence = slow
                .run(move |lookout| lookout.evidence(id, sample, &near))
                .await;
        }
    }
    let settled = run.borrow().copies_settled();
    if let Some(settled) = settled {
        settled.await;
    }
    let to_name = run.borrow_mut().spawn_to_name(asked.id);
    let spawned = match to_name {
        Some(mut to_name) => {
            let naming = std::mem::take(&mut to_name.naming);
            let named = slow.run(move |_| naming.name()).await;
            run.borrow_mut().spawn_named(to_name, named)
        }
        None => Default::default(),
    };
    run.borrow_mut().process(asked.id, evidence, spawned)
}

/// Sends `value` as JSON, written into a buffer of `size` bytes (the last answer's of its
/// kind, or 0: grown as needed), which is then set to this answer's. Serialized here, on the
/// reader's thread: the answers borrow the run's parts (not `Send`: `Rc`, `RefCell`), which
/// cannot cross to another.
fn send_json(reply: oneshot::Sender<Answer>, value: &impl Serialize, size: &mut usize) {
    let mut json = Vec::with_capacity(*size);
    let written = serde_json::to_writer(&mut json, value).is_ok();
    *size = json.len();
    let _ = reply.send(written.then_some(json));
}

/// No answer: the client says the process or gateway is not tracked.
fn refuse(reply: oneshot::Sender<Answer>) {
    let _ = reply.send(None);
}
