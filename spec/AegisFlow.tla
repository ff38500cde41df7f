------------------------------ MODULE AegisFlow ------------------------------
(***************************************************************************)
(* The master's phase state machine of aegis-flow and its recovery policy, *)
(* in plain TLA+.                                                          *)
(*                                                                         *)
(* A Controller and an Environment, mirroring the Python code one to one:  *)
(*                                                                         *)
(*   Step(s, e)  -- aegis_flow/master/machine.py, step(status, event):     *)
(*                  the transition table T1-T16 of DESIGN.md section 2,    *)
(*                  the counting rule (T11 first), the flap guard, the     *)
(*                  message layer (dedup, stale and future messages, the   *)
(*                  Pending exception, acks never deduplicated), and the   *)
(*                  recovery policy of aegis_flow/master/policy.py: blame  *)
(*                  by evidence (B1 T5s/T14s, B2-B5), the verdict of       *)
(*                  a round of checks from the rank's history (V1, V2),    *)
(*                  a failure answered once (V3), repeats (R1, T16).       *)
(*   Events(s)   -- aegis_flow/verify/environment.py, events(status):      *)
(*                  what workers, the runtime's timers and an operator can *)
(*                  do next: finish, restart (a new incarnation), lose a   *)
(*                  worker, fail with a cause (unknown, a user exception   *)
(*                  with a signature, container, hardware, a peer          *)
(*                  symptom), hang (sleeping or not), report the last run  *)
(*                  late while a suspect is pending, stop, connect         *)
(*                  timeout, and with MessageLayer the re-delivered        *)
(*                  messages (heartbeats answering older seqs, duplicates, *)
(*                  stale results).                                        *)
(*                                                                         *)
(* The state is one record `st`: the master's Status (master/model.py),    *)
(* reduced as docs/verification.md ("The TLA+ spec") explains: the global  *)
(* phase, the master's seq, recoverCount, shouldQuit, whether the command  *)
(* has run, whether an operator stopped the job, the suspect (blame), the  *)
(* culprit and the seq of the last run order (runSeq; 0 when no suspect   *)
(* can still need it, see Forget); per worker its inner phase, finished,   *)
(* retries, restarting, acked (the incarnation reduced to "has acked":     *)
(* incarnations are only ever compared for equality), the seq it last      *)
(* reported, finDone/errDone ("its last processed Finish/Error is for the  *)
(* current seq") and finRun/errRun (... "for runSeq": a message for        *)
(* another seq is rejected before dedup reads them), its flap counter, its *)
(* hang marks (hanging, waiting), the exit it was told to make, and its    *)
(* failure history: failures on its node, the kind of its open cause       *)
(* (CauseKinds: what policy.py tells apart) and whether its last charged   *)
(* failure had the user signature.                                         *)
(*                                                                         *)
(* Live states whose seq exceeds SeqBound are not entered; terminal ones   *)
(* always are (as `aegis-flow verify --seq-bound`).                        *)
(***************************************************************************)
EXTENDS Integers, FiniteSets, TLC

CONSTANTS Workers,        \* the ranks, e.g. {w1, w2, w3}; ordered by name
          MaxRetry,       \* counted failures a worker may have before T11
          FlapLimit,      \* uncounted replacements between two runs (T7)
          MessageLayer,   \* TRUE: model re-delivered, duplicate, stale messages
          SeqBound,       \* explore live states with seq <= SeqBound
          L2After,        \* failures on its node from which a rank restarts its container
          L3After,        \* ... from which its node is quarantined
          GiveUpOnRepeat, \* R1: the same user error twice in a row fails the job (T16)
          Resumes         \* TRUE: an operator may resume the job in any live phase (T8r)

ASSUME MaxRetry \in Nat /\ FlapLimit \in Nat /\ SeqBound \in Nat
ASSUME MessageLayer \in BOOLEAN /\ Workers # {} /\ GiveUpOnRepeat \in BOOLEAN
ASSUME Resumes \in BOOLEAN
ASSUME L2After \in Nat /\ L3After \in Nat /\ 1 <= L2After /\ L2After <= L3After

VARIABLE st

Phases == {"Pending", "BootChecking", "RunCommand", "Restarting",
           "Troubleshooting", "Succeed", "Failed", "Independent"}
Terminal == {"Succeed", "Failed", "Independent"}
Checking == {"BootChecking", "Troubleshooting"}
Exits == {"none", "node-fault", "container-restart", "slow-evicted"}

\* The open cause of a rank, as the policy tells causes apart (policy.judge):
\* none; a hardware or container class; the hang cause; a peer symptom (B1);
\* anything else ("error": an unknown cause, a lost or replaced pod, a failed
\* check's text -- transient, escalated by repetition).
CauseKinds == {"none", "error", "container", "hardware", "hang", "symptom"}
\* The causes a failed process reports (environment.CAUSES): "user" is an
\* unknown cause with the user signature (a Python exception at a step).
Causes == {"unknown", "user", "container", "hardware", "symptom"}
KindOf(c) == IF c \in {"unknown", "user"} THEN "error" ELSE c

Min(a, b) == IF a < b THEN a ELSE b
Max(a, b) == IF a > b THEN a ELSE b

\* The lowest rank of a non-empty set of workers (machine.py: busy[0]). TLC
\* chooses model values in the order the configuration creates them, and
\* every configuration here names them in rank order (w1, w2, ...).
Lowest(S) == CHOOSE x \in S : TRUE

-----------------------------------------------------------------------------
(* Initial status: Pending, nobody acked.                                  *)

Pod0 == [phase |-> "Pending", finished |-> FALSE, retries |-> 0,
         restarting |-> FALSE, acked |-> FALSE, seq |-> 0,
         finDone |-> FALSE, errDone |-> FALSE, flaps |-> 0,
         hanging |-> FALSE, exit |-> "none",
         failures |-> 0, cause |-> "none", sig |-> FALSE, waiting |-> FALSE,
         finRun |-> FALSE, errRun |-> FALSE, shared |-> FALSE, slow |-> FALSE]

Init == st = [phase |-> "Pending", seq |-> 0, recoverCount |-> 0,
              shouldQuit |-> FALSE, ran |-> FALSE, stopped |-> FALSE,
              blame |-> "none", culprit |-> "none", runSeq |-> 0,
              w |-> [x \in Workers |-> Pod0]]

-----------------------------------------------------------------------------
(* Controller: step(status, event).  Every handler returns                 *)
(* [s |-> next status, ignored |-> why]; an ignored event ("late",         *)
(* "stale", "duplicate", "future") leaves the status as it was.            *)

Ok(s) == [s |-> s, ignored |-> "no"]
Ignore(s, why) == [s |-> s, ignored |-> why]

\* Every broadcast bumps seq; a new seq makes every processed Finish/Error old.
Bump(p) == [p EXCEPT !.finDone = FALSE, !.errDone = FALSE]

\* Enter phase ph: seq+1, every round reset, broadcast ph's order. Entering
\* Restarting keeps each worker's inner phase (PhaseConsistency). A run order
\* is the new runSeq: no result answers it yet. Without a suspect, runSeq and
\* which results answer it are read by nothing before the next run order
\* overwrites them: they are forgotten (Forget), as the explorer's key does.
Broadcast(s, ph, keep) ==
    LET run == ph = "RunCommand"
        keepRun == ~run /\ s.blame # "none"
    IN  [s EXCEPT !.phase = ph, !.seq = @ + 1,
                  !.runSeq = IF run THEN s.seq + 1 ELSE IF keepRun THEN @ ELSE 0,
                  !.w = [x \in Workers |->
                            [Bump(s.w[x]) EXCEPT !.phase = IF keep THEN @ ELSE ph,
                                                 !.finished = FALSE,
                                                 !.hanging = FALSE,
                                                 !.waiting = FALSE,
                                                 !.slow = FALSE,
                                                 !.finRun = @ /\ keepRun,
                                                 !.errRun = @ /\ keepRun]]]

\* runSeq and finRun/errRun once no suspect is pending, out of RunCommand.
Forget(s) ==
    IF s.phase = "RunCommand" THEN s
    ELSE [s EXCEPT !.runSeq = 0,
                   !.w = [x \in Workers |-> [s.w[x] EXCEPT !.finRun = FALSE,
                                                          !.errRun = FALSE]]]

\* T11 / T12 / T16: Failed, shouldQuit, every inner phase Failed, broadcast quit.
Fail(s, recover) ==
    [s EXCEPT !.phase = "Failed", !.seq = @ + 1, !.shouldQuit = TRUE,
              !.recoverCount = IF recover THEN MaxRetry + 1 ELSE @,
              !.w = [x \in Workers |->
                        [Bump(s.w[x]) EXCEPT !.phase = "Failed",
                                             !.restarting = FALSE]]]

MaxRetries(s) == CHOOSE m \in {s.w[x].retries : x \in Workers} :
                    \A x \in Workers : s.w[x].retries <= m

\* The cap (T11 is checked first): a counted failure that takes a worker's
\* retries beyond MaxRetry fails the job, so recoverCount <= MaxRetry + 1.
ExceedsMaxRetry(r) == r > MaxRetry

\* Counting rule: retries[x] += 1, T11 first, else recoverCount = max retries.
Count(s, x) ==
    LET s1 == [s EXCEPT !.w[x].retries = @ + 1]
    IN  IF ExceedsMaxRetry(s1.w[x].retries)
        THEN [failed |-> TRUE, s |-> Fail(s1, TRUE)]
        ELSE [failed |-> FALSE, s |-> [s1 EXCEPT !.recoverCount = MaxRetries(s1)]]

\* A failure charged to x (B2-B4): R1/T16 first (the user signature twice in a
\* row); the suspect, if another rank, only saw a symptom; x's history records
\* it -- unless a new pod already answered it (V3; a hardware cause stays) --
\* x is the culprit, the blame is settled, and the failure is counted.
Charge(s, x, kind, sig, answered) ==
    IF GiveUpOnRepeat /\ sig /\ s.w[x].sig
    THEN [failed |-> TRUE, s |-> Fail(s, FALSE)]                       \* T16
    ELSE LET s1 == IF s.blame # "none" /\ s.blame # x
                   THEN [s EXCEPT !.w[s.blame].cause = "none"] ELSE s
             opened == ~answered \/ kind = "hardware"
             s2 == [s1 EXCEPT !.w[x].failures = @ + 1,
                              !.w[x].cause = IF opened THEN kind ELSE "none",
                              !.w[x].sig = sig,
                              !.culprit = x, !.blame = "none"]
         IN  Count(Forget(s2), x)

\* T3/T7/T10/T10c: an uncounted replacement during recovery, with the flap
\* guard (counted once the worker was replaced FlapLimit times since the
\* job last entered RunCommand). With a suspect pending the replaced rank is
\* the evidence (B2): charged first. (A node-fault exit also quarantines the
\* node: no decision reads that, so the spec leaves it out.)
ReplaceWorker(s, x, exit, newPod) ==
    LET b == Charge(s, x, "error", FALSE, newPod)
        s1 == IF s.blame # "none" THEN b.s ELSE s
        counted == s1.w[x].flaps >= FlapLimit
        c == Count(s1, x)
        s2 == IF counted THEN c.s ELSE s1
        s3 == [s2 EXCEPT !.w[x].restarting = TRUE,
                         !.w[x].flaps = IF counted THEN @ ELSE Min(@ + 1, FlapLimit),
                         !.w[x].exit = exit,
                         !.w[x].hanging = FALSE,
                         !.w[x].waiting = FALSE,
                         !.w[x].slow = FALSE]
    IN  IF s.blame # "none" /\ b.failed THEN b.s
        ELSE IF counted /\ c.failed THEN c.s
        ELSE IF s3.phase = "Restarting" THEN s3   \* already holding: no new round
        ELSE Broadcast(s3, "Restarting", TRUE)

\* T5/T6/T14: charged and counted; every training process stops.
CountedFailure(s, x, ph, kind, sig, answered) ==
    LET c == Charge(s, x, kind, sig, answered)
    IN  IF c.failed THEN c.s
        ELSE IF ph = "Restarting"
        THEN Broadcast([c.s EXCEPT !.w[x].restarting = TRUE, !.w[x].exit = "none"],
                       "Restarting", TRUE)
        ELSE Broadcast(c.s, ph, FALSE)

\* B1: a peer symptom stops every rank; the reporter is the suspect.
Suspect(s, x) == Broadcast([s EXCEPT !.blame = x], "Troubleshooting", FALSE)

\* A symptom needs a peer that could have caused it: another rank running.
LivePeer(s, x) == \E y \in Workers : y # x /\ ~s.w[y].finished

\* V3: what a rank that comes back as a new container (or on a new node) keeps.
Answered(p) ==
    IF p.exit \in {"node-fault", "slow-evicted"} THEN [p EXCEPT !.failures = 0, !.cause = "none"]
    ELSE IF p.cause # "none" /\ p.cause # "hardware" THEN [p EXCEPT !.cause = "none"]
    ELSE p

\* A restarting worker is back; T8 once every restarting worker is.
ReturnWorker(s0, x, newInc) ==
    LET s == IF newInc THEN [s0 EXCEPT !.w[x] = Answered(s0.w[x])] ELSE s0
        s1 == [s EXCEPT !.w[x].restarting = FALSE, !.w[x].exit = "none"]
    IN  IF \E y \in Workers : s1.w[y].restarting THEN s1
        ELSE Broadcast(s1, IF s1.ran THEN "Troubleshooting" ELSE "BootChecking", FALSE)

\* Ack (also the heartbeat): never deduplicated; any seq in Pending.
OnAck(s, e) ==
    LET x == e.w
        p == s.w[x]
        newInc == p.acked /\ e.new
        wseq == Min(IF newInc THEN e.seq ELSE Max(p.seq, e.seq), s.seq)
        s1 == [s EXCEPT !.w[x].seq = wseq]
    IN  IF e.seq > s.seq /\ s.phase # "Pending" THEN Ignore(s, "future")
        ELSE IF s.phase = "Pending" THEN                              \* T1
            LET s2 == [s1 EXCEPT !.w[x].acked = TRUE]
            IN  IF \A y \in Workers : s2.w[y].acked
                THEN Ok(Broadcast(s2, "BootChecking", FALSE))
                ELSE Ok(s2)
        ELSE IF s.phase \in Terminal THEN Ok(s)
        ELSE IF p.restarting THEN
            IF newInc \/ p.exit = "none" THEN Ok(ReturnWorker(s1, x, newInc))  \* T8
            ELSE Ok(s1)                    \* the old pod: its exit is re-sent
        ELSE IF newInc THEN
            IF s.phase = "RunCommand"
            THEN IF p.finished THEN Ok(s1)     \* a finished worker may go
                 ELSE Ok(CountedFailure(s1, x, "Restarting", "error", FALSE, TRUE)) \* T6
            ELSE Ok(ReplaceWorker(s1, x, "none", TRUE))                \* T7
        ELSE Ok(s1)

OnLost(s, e) ==
    LET x == e.w
        p == s.w[x]
    IN  IF s.phase = "Pending" THEN                                    \* T7p
            IF p.acked THEN Ok([s EXCEPT !.w[x].acked = FALSE])
            ELSE Ignore(s, "late")
        ELSE IF s.phase \in Terminal \/ p.restarting THEN Ignore(s, "late")
        ELSE IF s.phase = "RunCommand" THEN
            IF p.finished THEN Ignore(s, "late")
            ELSE Ok(CountedFailure(s, x, "Restarting", "error", FALSE, FALSE))  \* T6
        ELSE Ok(ReplaceWorker(s, x, "none", FALSE))                    \* T7

\* The verdict of a round of checks ("none" = healthy), V1-V2 (policy.judge):
\* the checks' own class, judged with the rank's open failure and history.
Escalated(p) == IF p.failures >= L3After THEN "hardware"
                ELSE IF p.failures >= L2After THEN "container" ELSE "none"
Judge(p, checks) ==
    LET esc == Escalated(p)
        base == IF checks = "transient" THEN "none" ELSE checks
    IN  IF checks = "hardware" THEN "hardware"
        ELSE IF checks = "container"
        THEN IF esc = "hardware" THEN "hardware" ELSE "container"
        ELSE IF p.cause = "none" THEN base                            \* the checks decide
        ELSE IF p.cause = "hardware" THEN "hardware"                  \* D6
        ELSE IF p.cause = "container"                                 \* D7
        THEN IF esc = "hardware" THEN "hardware" ELSE "container"
        ELSE IF p.cause = "hang" \/ base = "slow" THEN "slow"         \* D8
        ELSE IF p.cause = "symptom" THEN base                         \* D10, B1
        ELSE IF esc # "none" THEN esc ELSE base                       \* D10

Passes(fault, troubleshooting) ==
    fault = "none" \/ fault = "slow" \/ (troubleshooting /\ fault = "transient")

\* T3j: the ranks whose failed storage check of this round waits for the
\* others' results (one storage fault in this model: every key is the same).
Held(s) == {y \in Workers : s.w[y].shared /\ s.w[y].finDone}
Release(s, x) ==
    ReplaceWorker([s EXCEPT !.w = [y \in Workers |-> [s.w[y] EXCEPT !.shared = FALSE]]],
                  x, "node-fault", FALSE)
Hold(s, x) ==
    LET sh == [s EXCEPT !.w[x].shared = TRUE]
    IN  IF \E y \in Workers : sh.w[y].finished THEN Release(sh, x)
        ELSE IF \A y \in Workers : sh.w[y].shared /\ sh.w[y].finDone
        THEN Fail(sh, FALSE)                                        \* the job's storage
        ELSE sh

\* s0: the status before the event; s: with the worker's reported seq.
OnFinish(s0, s, e) ==
    LET x == e.w
        ph == s.phase
        p == [s.w[x] EXCEPT !.finDone = TRUE, !.finRun = (s.seq = s.runSeq),
                            !.shared = FALSE]
        own == IF e.ok THEN e.fault ELSE IF e.fault = "none" THEN "hardware" ELSE e.fault
        fault == IF ph = "Troubleshooting" THEN Judge(p, own) ELSE own
        s2 == [s EXCEPT !.w[x] = p]
        s3 == [s EXCEPT !.w[x] = [p EXCEPT !.finished = TRUE,
                                    !.phase = IF ph = "RunCommand" THEN "Succeed" ELSE ph]]
        b3 == Charge(s3, s3.blame, s3.w[s3.blame].cause, FALSE, FALSE)   \* B3
        s3b == IF ph = "Troubleshooting" /\ s3.blame # "none" THEN b3.s ELSE s3
        s4 == IF ph = "Troubleshooting"                                \* T9
              THEN [s3b EXCEPT !.culprit = "none",
                               !.w = [y \in Workers |->
                                        [s3b.w[y] EXCEPT !.retries = s3b.recoverCount,
                                                         !.cause = "none"]]]
              ELSE s3b
        s5 == [s4 EXCEPT !.ran = TRUE,
                         !.w = [y \in Workers |-> [s4.w[y] EXCEPT !.flaps = 0]]]
    IN  IF ph \notin Checking \cup {"RunCommand"} THEN Ignore(s0, "late")
        ELSE IF p.finished THEN Ignore(s0, "late")
        ELSE IF ~Passes(fault, ph = "Troubleshooting") THEN
            IF ph = "RunCommand" THEN Ignore(s0, "late")
            ELSE IF e.shared /\ ~e.ok THEN Ok(Hold(s2, x))                \* T3j
            ELSE IF ph = "Troubleshooting" /\ fault = "container"
            THEN Ok(ReplaceWorker(s2, x, "container-restart", FALSE))  \* T10c
            ELSE Ok(ReplaceWorker(s2, x, "node-fault", FALSE))         \* T3/T10
        ELSE IF Held(s3) # {} THEN Ok(Release(s3, Lowest(Held(s3))))  \* T3j
        ELSE IF ~\A y \in Workers : s3.w[y].finished THEN Ok(s3)
        ELSE IF ph = "RunCommand" THEN                                  \* T4
            Ok([s3 EXCEPT !.phase = "Succeed", !.seq = @ + 1, !.shouldQuit = TRUE,
                          !.w = [y \in Workers |->
                                    [Bump(s3.w[y]) EXCEPT !.phase = "Succeed"]]])
        ELSE IF ph = "Troubleshooting" /\ s3.blame # "none" /\ b3.failed
        THEN Ok(b3.s)                                                   \* B3 + T11/T16
        ELSE Ok(Broadcast(s5, "RunCommand", FALSE))                    \* T2/T9

OnError(s0, s, e) ==
    LET x == e.w
        p == [s.w[x] EXCEPT !.errDone = TRUE, !.errRun = (s.seq = s.runSeq)]
        s1 == [s EXCEPT !.w[x] = p]
    IN  IF s.phase # "RunCommand" \/ p.finished THEN Ignore(s0, "late")
        ELSE IF e.cause = "symptom" /\ LivePeer(s, x)                   \* T5s (B1)
        THEN Ok(Suspect([s1 EXCEPT !.w[x].cause = "symptom"], x))
        ELSE Ok(CountedFailure(s1, x, "Troubleshooting", KindOf(e.cause),
                               e.cause = "user", FALSE))                \* T5 (B4)

OnHang(s0, s, e) ==
    LET x == e.w
        busy == {y \in Workers : s.w[y].hanging /\ ~s.w[y].waiting /\ ~s.w[y].finished}
    IN  IF s.phase # "RunCommand" \/ s.w[x].finished THEN Ignore(s0, "late")
        ELSE IF e.quit THEN                                             \* T14
            IF e.behind # "none" /\ ~s.w[e.behind].finished
               /\ ~s.w[e.behind].restarting                              \* B5: counts
            THEN Ok(CountedFailure(s, e.behind, "Troubleshooting", "hang", FALSE, FALSE))
            ELSE IF ~e.waiting \/ ~LivePeer(s, x)                       \* B4
            THEN Ok(CountedFailure(s, x, "Troubleshooting", "hang", FALSE, FALSE))
            ELSE IF busy # {}                                           \* B2 by the marks
            THEN Ok(CountedFailure(s, Lowest(busy), "Troubleshooting", "hang", FALSE, FALSE))
            ELSE Ok(Suspect([s EXCEPT !.w[x].cause = "hang"], x))       \* T14s (B1)
        ELSE IF s.w[x].hanging /\ s.w[x].waiting = e.waiting
        THEN Ignore(s0, "duplicate")
        ELSE Ok([s EXCEPT !.w[x].hanging = TRUE, !.w[x].waiting = e.waiting])  \* T13

\* B2: a late report of the last run while a suspect is pending.
OnEvidence(s, e) ==
    LET x == e.w
        p == s.w[x]
        symptom == IF e.type = "Error" THEN e.cause = "symptom" ELSE e.waiting
        s1 == IF e.type = "Error"
              THEN [s EXCEPT !.w[x].errRun = TRUE, !.w[x].errDone = (s.runSeq = s.seq)]
              ELSE s
        c == IF e.type = "Error" THEN Charge(s1, x, KindOf(e.cause), e.cause = "user", FALSE)
             ELSE Charge(s1, x, "hang", FALSE, FALSE)
    IN  IF e.type = "Error" /\ p.errRun THEN Ignore(s, "duplicate")
        ELSE IF symptom \/ p.restarting THEN Ignore(s, "stale")
        ELSE Ok(c.s)

\* Finish, Error, Hang, HangWithQuit carry the seq they answer.
OnSeqEvent(s, e) ==
    LET x == e.w
        p == s.w[x]
        s1 == [s EXCEPT !.w[x].seq = e.seq]
    IN  IF s.phase \in Terminal THEN Ignore(s, "late")
        ELSE IF e.seq > s.seq THEN Ignore(s, "future")
        ELSE IF s.blame # "none" /\ e.seq = s.runSeq
                /\ (e.type = "Error" \/ (e.type = "Hang" /\ e.quit))
        THEN OnEvidence(s, e)
        ELSE IF e.seq < s.seq THEN Ignore(s, "stale")
        ELSE IF (e.type = "Finish" /\ p.finDone) \/ (e.type = "Error" /\ p.errDone)
        THEN Ignore(s, "duplicate")
        ELSE IF p.restarting THEN Ignore(s, "late")
        ELSE IF e.type = "Finish" THEN OnFinish(s, s1, e)
        ELSE IF e.type = "Error" THEN OnError(s, s1, e)
        ELSE OnHang(s, s1, e)

\* T13s: a rank slower than its peers for a sustained window is marked, kept.
OnSlow(s, e) ==
    LET p == s.w[e.w]
    IN  IF s.phase # "RunCommand" \/ p.finished \/ p.restarting THEN Ignore(s, "late")
        ELSE IF p.slow THEN Ignore(s, "duplicate")
        ELSE Ok([s EXCEPT !.w[e.w].slow = TRUE])

\* A checkpoint completed: the safe point a slow rank waits for. T13e evicts
\* it (the lowest such rank) as a replacement with the slow-evicted exit.
OnCheckpoint(s) ==
    LET slow == {y \in Workers : s.w[y].slow /\ ~s.w[y].finished /\ ~s.w[y].restarting}
    IN  IF s.phase \in Terminal THEN Ignore(s, "late")
        ELSE IF s.phase = "RunCommand" /\ slow # {}
        THEN Ok(ReplaceWorker(s, Lowest(slow), "slow-evicted", FALSE))
        ELSE Ok(s)

Step(s, e) ==
    CASE e.type = "Ack"  -> OnAck(s, e)
      [] e.type = "Slow" -> OnSlow(s, e)
      [] e.type = "Checkpoint" -> OnCheckpoint(s)
      [] e.type = "Lost" -> OnLost(s, e)
      [] e.type = "Stop" ->                                             \* T12
            IF s.phase \in Terminal THEN Ignore(s, "late")
            ELSE Ok(Fail([s EXCEPT !.stopped = TRUE], FALSE))
      [] e.type = "Resume" ->                                           \* T8r
            IF s.phase \in Terminal \cup {"Pending"} THEN Ignore(s, "late")
            ELSE Ok(Broadcast([s EXCEPT !.blame = "none",
                                        !.w = [x \in Workers |->
                                  [s.w[x] EXCEPT !.restarting = TRUE, !.exit = "none"]]],
                              "Restarting", TRUE))
      [] e.type = "ConnectTimeout" ->                                   \* T15
            IF s.phase # "Pending" THEN Ignore(s, "late")
            ELSE Ok(Broadcast(s, "Independent", FALSE))
      [] OTHER -> OnSeqEvent(s, e)

-----------------------------------------------------------------------------
(* Environment: events(status).  Events are records of one shape; `kind`   *)
(* says why the environment produced it ("normal" first delivery of a      *)
(* fault, "cooperative" one of a fault-free world, "symptom" one of a peer *)
(* symptom, "heartbeat", "duplicate", "stale", "stop").                    *)

AnyWorker == CHOOSE x \in Workers : TRUE

Ev(type, x, seq, new, ok, fault, quit, kind, cause, waiting) ==
    [type |-> type, w |-> x, seq |-> seq, new |-> new, ok |-> ok,
     fault |-> fault, quit |-> quit, kind |-> kind, cause |-> cause,
     waiting |-> waiting, shared |-> FALSE, behind |-> "none"]
AckE(x, new, seq, kind) == Ev("Ack", x, seq, new, FALSE, "none", FALSE, kind, "none", FALSE)
FinishE(x, seq, ok, fault, kind) ==
    Ev("Finish", x, seq, FALSE, ok, fault, FALSE, kind, "none", FALSE)
\* every rank's io check failing on one full shared filesystem (T3j)
SharedE(x, seq) == [FinishE(x, seq, FALSE, "hardware", "normal") EXCEPT !.shared = TRUE]
ErrorE(x, seq, cause, kind) ==
    Ev("Error", x, seq, FALSE, FALSE, "none", FALSE, kind, cause, FALSE)
HangE(x, seq, quit, waiting) ==
    Ev("Hang", x, seq, FALSE, FALSE, "none", quit,
       IF waiting THEN "symptom" ELSE "normal", "none", waiting)
\* a waiting rank's HangWithQuit whose progress counts show y behind every peer (B5)
HangBehindE(x, seq, y) == [HangE(x, seq, TRUE, TRUE) EXCEPT !.behind = y]
LostE(x) == Ev("Lost", x, 0, FALSE, FALSE, "none", FALSE, "normal", "none", FALSE)
SlowE(x) == Ev("Slow", x, 0, FALSE, FALSE, "none", FALSE, "normal", "none", FALSE)
CheckpointE == Ev("Checkpoint", AnyWorker, 0, FALSE, FALSE, "none", FALSE, "normal", "none",
                  FALSE)
StopE == Ev("Stop", AnyWorker, 0, FALSE, FALSE, "none", FALSE, "stop", "none", FALSE)
\* an operator resumes an interrupted job: every worker was started again
ResumeE == Ev("Resume", AnyWorker, 0, FALSE, FALSE, "none", FALSE, "resume", "none", FALSE)
TimeoutE == Ev("ConnectTimeout", AnyWorker, 0, FALSE, FALSE, "none", FALSE, "normal",
               "none", FALSE)
ErrKind(c) == IF c = "symptom" THEN "symptom" ELSE "normal"

\* First deliveries of what worker x can do now (at the current seq).
WorkerEvents(s, x) ==
    LET p == s.w[x]
        q == s.seq
        \* a replacement pod has heard no order: with messages its Ack answers 0
        newPod == AckE(x, TRUE, IF MessageLayer THEN 0 ELSE q, "normal")
        back == AckE(x, TRUE, IF MessageLayer THEN 0 ELSE q, "cooperative")
        finishes == IF p.finished THEN {}
                    ELSE {FinishE(x, q, TRUE, "none", "cooperative"),
                          FinishE(x, q, FALSE, "hardware", "normal"), SharedE(x, q)}
                         \cup (IF s.phase = "Troubleshooting"
                               THEN {FinishE(x, q, FALSE, "container", "normal")}
                               ELSE {})
    IN  IF s.phase = "Pending" THEN
            IF p.acked THEN {LostE(x)} ELSE {AckE(x, FALSE, q, "cooperative")}
        ELSE IF p.restarting THEN {back, AckE(x, FALSE, q, "cooperative")}
        ELSE IF s.phase \in Checking THEN finishes \cup {LostE(x), newPod}
        ELSE IF s.phase = "RunCommand" /\ ~p.finished THEN
            {FinishE(x, q, TRUE, "none", "cooperative"), LostE(x), newPod,
             HangE(x, q, TRUE, FALSE), HangE(x, q, TRUE, TRUE)}
            \cup {HangBehindE(x, q, y) : y \in Workers \ {x}}
            \cup (IF p.slow THEN {} ELSE {SlowE(x)})
            \cup {ErrorE(x, q, c, ErrKind(c)) : c \in Causes}
            \cup {HangE(x, q, FALSE, b) : b \in {b2 \in BOOLEAN :
                                                   ~(p.hanging /\ p.waiting = b2)}}
        ELSE {LostE(x), newPod}

\* B2: while a suspect is pending, a rank that has reported neither an Error
\* nor its success for the last run order may still report it.
LateEvents(s, x) ==
    LET p == s.w[x]
    IN  IF s.blame = "none" \/ x = s.blame \/ p.errRun \/ p.finRun THEN {}
        ELSE {ErrorE(x, s.runSeq, c, ErrKind(c)) : c \in Causes}
             \cup {HangE(x, s.runSeq, TRUE, FALSE), HangE(x, s.runSeq, TRUE, TRUE)}

\* Re-deliveries: heartbeats over older seqs, duplicates, stale results.
MessageEvents(s, x) ==
    LET p == s.w[x]
        q == s.seq
        okDup == p.finished \/ p.exit = "none"
        faultDup == IF okDup THEN "none"
                    ELSE IF p.exit = "container-restart" THEN "container"
                    ELSE "hardware"
        evidence == s.blame # "none" /\ q - 1 = s.runSeq
    IN  (IF p.acked THEN {AckE(x, FALSE, k, "heartbeat") : k \in p.seq..q} ELSE {})
        \cup (IF p.finDone THEN {FinishE(x, q, okDup, faultDup, "duplicate")} ELSE {})
        \cup (IF p.errDone THEN {ErrorE(x, q, "unknown", "duplicate")} ELSE {})
        \cup (IF s.blame = x /\ 0 < s.runSeq /\ s.runSeq < q /\ p.errRun
              THEN {ErrorE(x, s.runSeq, "symptom", "duplicate")} ELSE {})
        \cup (IF q > 0
              THEN {FinishE(x, q - 1, TRUE, "none", "stale"),
                    FinishE(x, q - 1, FALSE, "hardware", "stale")}
                   \cup (IF evidence THEN {} ELSE {ErrorE(x, q - 1, "unknown", "stale")})
              ELSE {})

Events(s) ==
    IF s.phase \in Terminal THEN {}
    ELSE UNION {WorkerEvents(s, x) \cup LateEvents(s, x)
                \cup (IF MessageLayer THEN MessageEvents(s, x) ELSE {})
                : x \in Workers}
         \cup (IF s.phase = "RunCommand" /\ \E y \in Workers : s.w[y].slow
               THEN {CheckpointE} ELSE {})
         \cup (IF s.phase = "Pending" THEN {TimeoutE}
               ELSE IF Resumes THEN {ResumeE} ELSE {})
         \cup {StopE}

-----------------------------------------------------------------------------
(* The system.                                                             *)

InBound(n) == n.phase \in Terminal \/ n.seq <= SeqBound

Deliver(e) == LET n == Step(st, e).s IN InBound(n) /\ st' = n

\* A finished job stays as it is.
Done == st.phase \in Terminal /\ UNCHANGED st

Next == (\E e \in Events(st) : Deliver(e)) \/ Done

\* Fairness for the termination property: the connect timeout fires, every
\* worker eventually reports its check/command passing, and a worker being
\* replaced eventually comes back as a new pod.
FinishOk(x) == /\ st.phase \in Checking \cup {"RunCommand"}
               /\ ~st.w[x].finished /\ ~st.w[x].restarting
               /\ Deliver(FinishE(x, st.seq, TRUE, "none", "cooperative"))
               /\ st' # st
ComesBack(x) == /\ st.phase = "Restarting" /\ st.w[x].restarting
                /\ Deliver(AckE(x, TRUE, IF MessageLayer THEN 0 ELSE st.seq, "cooperative"))
                /\ st' # st
TimesOut == st.phase = "Pending" /\ Deliver(TimeoutE)

vars == st
\* Workers are interchangeable (P0.cfg: SYMMETRY Symmetry; never with -dump),
\* but for one tie-break (Lowest, T14 with two ranks marked hung): see
\* docs/verification.md.
Symmetry == Permutations(Workers)
Spec == Init /\ [][Next]_vars

FairSpec == Spec /\ WF_vars(TimesOut)
            /\ \A x \in Workers : WF_vars(FinishOk(x)) /\ WF_vars(ComesBack(x))

-----------------------------------------------------------------------------
(* P0: the article's five state invariants.                                *)

ValidPhase == st.phase \in Phases
ValidInnerPhase == \A x \in Workers : st.w[x].phase \in Phases
RecoverCountBound == st.recoverCount \in 0..(MaxRetry + 1)
RetriesBound == \A x \in Workers : st.w[x].retries \in 0..(MaxRetry + 1)
\* a worker neither finished nor restarting is in the global phase, except
\* while Restarting (workers keep the phase they were in)
PhaseConsistency ==
    st.phase = "Restarting"
    \/ \A x \in Workers : st.w[x].finished \/ st.w[x].restarting
                          \/ st.w[x].phase = st.phase

(* P1: the message layer.                                                  *)

\* a worker's seq never exceeds the master's
WorkerSeqNumBound == \A x \in Workers : st.w[x].seq <= st.seq
\* a Finish/Error already processed (same worker, seq, type) is ignored as a
\* duplicate, idempotently
NoFinishDoubleProcessed ==
    \A e \in Events(st) : e.kind = "duplicate" =>
        Step(st, e).s = st /\ Step(st, e).ignored = "duplicate"
\* a Finish/Error with an older seq than the master's is rejected as stale
StaleFinishRejected ==
    \A e \in Events(st) : e.kind = "stale" =>
        Step(st, e).s = st /\ Step(st, e).ignored = "stale"
\* the master's seq never decreases (an action property: PROPERTY)
MasterSeqNumMonotonic == [][st'.seq >= st.seq]_vars

(* The recovery policy.                                                    *)

\* A suspect is pending only while troubleshooting (or in the Failed status
\* a stop, T11 or T16 left), the last run order is older than the current
\* one, and its open cause is the symptom it saw.
BlameConsistency ==
    st.blame # "none" /\ st.phase # "Failed" =>
        /\ st.phase = "Troubleshooting" /\ 0 < st.runSeq /\ st.runSeq < st.seq
        /\ st.w[st.blame].cause \in {"symptom", "hang"}
\* A peer symptom (a symptom Error, a hang report of a sleeping process)
\* raises nobody's failure count -- unless no other rank is running (B1) or,
\* for a hang report, a rank marked hung and not sleeping is charged (B2), or
\* the rank its progress counts show behind every peer (B5).
SymptomChargesNobody ==
    \A e \in Events(st) :
        (e.kind = "symptom" /\ \E y \in Workers : y # e.w /\ ~st.w[y].finished)
        => \A y \in Workers : Step(st, e).s.w[y].failures <= st.w[y].failures
                             \/ (e.type = "Hang" /\ st.w[y].hanging /\ ~st.w[y].waiting)
                             \/ (e.type = "Hang" /\ e.behind = y)

(* Deadlock freedom and termination.                                       *)

\* A way on other than Stop: some event changes the status (an edge cut by
\* the seq bound counts: the job goes on beyond the bound).
\* What an operator does (stop the job, resume it) is no progress of the job.
Operator == {"Stop", "Resume"}
NoDeadlock ==
    st.phase \in Terminal
    \/ \E e \in Events(st) : e.type \notin Operator /\ Step(st, e).s # st

\* Some event other than an operator's would take the job beyond the seq bound.
CutHere == \E e \in Events(st) : e.type \notin Operator /\ ~InBound(Step(st, e).s)

\* Under FairSpec every behaviour ends, or reaches the seq bound.
Termination == <>(st.phase \in Terminal \/ CutHere)

=============================================================================
