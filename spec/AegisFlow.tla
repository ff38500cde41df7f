------------------------------ MODULE AegisFlow ------------------------------
(***************************************************************************)
(* The master's phase state machine of aegis-flow, in plain TLA+.          *)
(*                                                                         *)
(* A Controller and an Environment, mirroring the Python code one to one:  *)
(*                                                                         *)
(*   Step(s, e)  -- aegis_flow/master/machine.py, step(status, event):     *)
(*                  the transition table T1-T15 of DESIGN.md section 2,    *)
(*                  the counting rule (T11 first), the flap guard and the  *)
(*                  message layer (dedup, stale and future messages, the   *)
(*                  Pending exception, acks never deduplicated).           *)
(*   Events(s)   -- aegis_flow/verify/environment.py, events(status):      *)
(*                  what workers, the runtime's timers and an operator can *)
(*                  do next: finish, restart (a new incarnation), lose a   *)
(*                  worker, error, hang, stop, connect timeout, and with   *)
(*                  MessageLayer the re-delivered messages (heartbeats     *)
(*                  answering older seqs, duplicates, stale results).      *)
(*                                                                         *)
(* The state is one record `st`: the master's Status (master/model.py),    *)
(* reduced as docs/verification.md ("The TLA+ spec") explains: the global  *)
(* phase, the master's seq, recoverCount, shouldQuit, whether the command  *)
(* has run,                                                                *)
(* whether an operator stopped the job, and per worker its inner phase,    *)
(* finished, retries, restarting, acked (the incarnation reduced to "has   *)
(* acked": incarnations are only ever compared for equality), the seq it   *)
(* last reported, finDone/errDone ("its last processed Finish/Error is for *)
(* the current seq": a message for another seq is rejected before dedup    *)
(* reads them), its flap counter, its hang mark, the exit it was told to   *)
(* make and whether its node is quarantined.                               *)
(*                                                                         *)
(* Live states whose seq exceeds SeqBound are not entered; terminal ones   *)
(* always are (as `aegis-flow verify --seq-bound`).                        *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS Workers,      \* the ranks, e.g. {w1, w2, w3}; ordered by name
          MaxRetry,     \* counted failures a worker may have before T11
          FlapLimit,    \* uncounted replacements between two runs (T7)
          MessageLayer, \* TRUE: model re-delivered, duplicate, stale messages
          SeqBound      \* explore live states with seq <= SeqBound

ASSUME MaxRetry \in Nat /\ FlapLimit \in Nat /\ SeqBound \in Nat
ASSUME MessageLayer \in BOOLEAN /\ Workers # {}

VARIABLE st

Phases == {"Pending", "BootChecking", "RunCommand", "Restarting",
           "Troubleshooting", "Succeed", "Failed", "Independent"}
Terminal == {"Succeed", "Failed", "Independent"}
Checking == {"BootChecking", "Troubleshooting"}
Exits == {"none", "node-fault", "container-restart"}

Min(a, b) == IF a < b THEN a ELSE b
Max(a, b) == IF a > b THEN a ELSE b

-----------------------------------------------------------------------------
(* Initial status: Pending, nobody acked.                                  *)

Pod0 == [phase |-> "Pending", finished |-> FALSE, retries |-> 0,
         restarting |-> FALSE, acked |-> FALSE, seq |-> 0,
         finDone |-> FALSE, errDone |-> FALSE, flaps |-> 0,
         hanging |-> FALSE, exit |-> "none", quarantined |-> FALSE]

Init == st = [phase |-> "Pending", seq |-> 0, recoverCount |-> 0,
              shouldQuit |-> FALSE, ran |-> FALSE, stopped |-> FALSE,
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
\* Restarting keeps each worker's inner phase (PhaseConsistency).
Broadcast(s, ph, keep) ==
    [s EXCEPT !.phase = ph, !.seq = @ + 1,
              !.w = [x \in Workers |->
                        [Bump(s.w[x]) EXCEPT !.phase = IF keep THEN @ ELSE ph,
                                             !.finished = FALSE,
                                             !.hanging = FALSE]]]

\* T11 / T12: Failed, shouldQuit, every inner phase Failed, broadcast quit.
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

\* T3/T7/T10/T10c: an uncounted replacement during recovery, with the flap
\* guard (counted once the worker was replaced FlapLimit times since the
\* job last entered RunCommand).
ReplaceWorker(s, x, exit) ==
    LET counted == s.w[x].flaps >= FlapLimit
        s1 == IF exit = "node-fault"
              THEN [s EXCEPT !.w[x].quarantined = TRUE] ELSE s
        c == Count(s1, x)
        s2 == IF counted THEN c.s ELSE s1
        s3 == [s2 EXCEPT !.w[x].restarting = TRUE,
                         !.w[x].flaps = IF counted THEN @ ELSE Min(@ + 1, FlapLimit),
                         !.w[x].exit = exit,
                         !.w[x].hanging = FALSE]
    IN  IF counted /\ c.failed THEN c.s
        ELSE IF s3.phase = "Restarting" THEN s3   \* already holding: no new round
        ELSE Broadcast(s3, "Restarting", TRUE)

\* T5/T6/T14: counted; every training process stops (the broadcast does it).
CountedFailure(s, x, ph) ==
    LET c == Count(s, x)
    IN  IF c.failed THEN c.s
        ELSE IF ph = "Restarting"
        THEN Broadcast([c.s EXCEPT !.w[x].restarting = TRUE, !.w[x].exit = "none"],
                       "Restarting", TRUE)
        ELSE Broadcast(c.s, ph, FALSE)

\* A restarting worker is back; T8 once every restarting worker is.
ReturnWorker(s, x) ==
    LET s1 == [s EXCEPT !.w[x].restarting = FALSE, !.w[x].exit = "none"]
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
            IF newInc \/ p.exit = "none" THEN Ok(ReturnWorker(s1, x))  \* T8
            ELSE Ok(s1)                    \* the old pod: its exit is re-sent
        ELSE IF newInc THEN
            IF s.phase = "RunCommand"
            THEN IF p.finished THEN Ok(s1)     \* a finished worker may go
                 ELSE Ok(CountedFailure(s1, x, "Restarting"))          \* T6
            ELSE Ok(ReplaceWorker(s1, x, "none"))                      \* T7
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
            ELSE Ok(CountedFailure(s, x, "Restarting"))               \* T6
        ELSE Ok(ReplaceWorker(s, x, "none"))                           \* T7

\* s0: the status before the event; s: with the worker's reported seq.
OnFinish(s0, s, e) ==
    LET x == e.w
        ph == s.phase
        p == [s.w[x] EXCEPT !.finDone = TRUE]
        passes == e.ok \/ e.fault = "slow"
                  \/ (e.fault = "transient" /\ ph = "Troubleshooting")
        s2 == [s EXCEPT !.w[x] = p]
        s3 == [s EXCEPT !.w[x] = [p EXCEPT !.finished = TRUE,
                                    !.phase = IF ph = "RunCommand" THEN "Succeed" ELSE ph]]
        s4 == IF ph = "Troubleshooting"                                \* T9
              THEN [s3 EXCEPT !.w = [y \in Workers |->
                                        [s3.w[y] EXCEPT !.retries = s3.recoverCount]]]
              ELSE s3
        s5 == [s4 EXCEPT !.ran = TRUE,
                         !.w = [y \in Workers |-> [s4.w[y] EXCEPT !.flaps = 0]]]
    IN  IF ph \notin Checking \cup {"RunCommand"} THEN Ignore(s0, "late")
        ELSE IF p.finished THEN Ignore(s0, "late")
        ELSE IF ~passes THEN
            IF ph = "RunCommand" THEN Ignore(s0, "late")
            ELSE IF ph = "Troubleshooting" /\ e.fault = "container"
            THEN Ok(ReplaceWorker(s2, x, "container-restart"))          \* T10c
            ELSE Ok(ReplaceWorker(s2, x, "node-fault"))                 \* T3/T10
        ELSE IF ~\A y \in Workers : s3.w[y].finished THEN Ok(s3)
        ELSE IF ph = "RunCommand" THEN                                  \* T4
            Ok([s3 EXCEPT !.phase = "Succeed", !.seq = @ + 1, !.shouldQuit = TRUE,
                          !.w = [y \in Workers |->
                                    [Bump(s3.w[y]) EXCEPT !.phase = "Succeed"]]])
        ELSE Ok(Broadcast(s5, "RunCommand", FALSE))                    \* T2/T9

OnError(s0, s, e) ==
    LET x == e.w
        p == [s.w[x] EXCEPT !.errDone = TRUE]
    IN  IF s.phase # "RunCommand" \/ p.finished THEN Ignore(s0, "late")
        ELSE Ok(CountedFailure([s EXCEPT !.w[x] = p], x, "Troubleshooting"))  \* T5

OnHang(s0, s, e) ==
    LET x == e.w
    IN  IF s.phase # "RunCommand" \/ s.w[x].finished THEN Ignore(s0, "late")
        ELSE IF e.quit THEN Ok(CountedFailure(s, x, "Troubleshooting"))      \* T14
        ELSE IF s.w[x].hanging THEN Ignore(s0, "duplicate")
        ELSE Ok([s EXCEPT !.w[x].hanging = TRUE])                       \* T13

\* Finish, Error, Hang, HangWithQuit carry the seq they answer.
OnSeqEvent(s, e) ==
    LET x == e.w
        p == s.w[x]
        s1 == [s EXCEPT !.w[x].seq = e.seq]
    IN  IF s.phase \in Terminal THEN Ignore(s, "late")
        ELSE IF e.seq > s.seq THEN Ignore(s, "future")
        ELSE IF e.seq < s.seq THEN Ignore(s, "stale")
        ELSE IF (e.type = "Finish" /\ p.finDone) \/ (e.type = "Error" /\ p.errDone)
        THEN Ignore(s, "duplicate")
        ELSE IF p.restarting THEN Ignore(s, "late")
        ELSE IF e.type = "Finish" THEN OnFinish(s, s1, e)
        ELSE IF e.type = "Error" THEN OnError(s, s1, e)
        ELSE OnHang(s, s1, e)

Step(s, e) ==
    CASE e.type = "Ack"  -> OnAck(s, e)
      [] e.type = "Lost" -> OnLost(s, e)
      [] e.type = "Stop" ->                                             \* T12
            IF s.phase \in Terminal THEN Ignore(s, "late")
            ELSE Ok(Fail([s EXCEPT !.stopped = TRUE], FALSE))
      [] e.type = "ConnectTimeout" ->                                   \* T15
            IF s.phase # "Pending" THEN Ignore(s, "late")
            ELSE Ok(Broadcast(s, "Independent", FALSE))
      [] OTHER -> OnSeqEvent(s, e)

-----------------------------------------------------------------------------
(* Environment: events(status).  Events are records of one shape; `kind`   *)
(* says why the environment produced it ("normal" first delivery,          *)
(* "heartbeat", "duplicate", "stale", "stop").                              *)

AnyWorker == CHOOSE x \in Workers : TRUE

Ev(type, x, seq, new, ok, fault, quit, kind) ==
    [type |-> type, w |-> x, seq |-> seq, new |-> new, ok |-> ok,
     fault |-> fault, quit |-> quit, kind |-> kind]
AckE(x, new, seq, kind) == Ev("Ack", x, seq, new, FALSE, "none", FALSE, kind)
FinishE(x, seq, ok, fault, kind) == Ev("Finish", x, seq, FALSE, ok, fault, FALSE, kind)
ErrorE(x, seq, kind) == Ev("Error", x, seq, FALSE, FALSE, "none", FALSE, kind)
HangE(x, seq, quit) == Ev("Hang", x, seq, FALSE, FALSE, "none", quit, "normal")
LostE(x) == Ev("Lost", x, 0, FALSE, FALSE, "none", FALSE, "normal")
StopE == Ev("Stop", AnyWorker, 0, FALSE, FALSE, "none", FALSE, "stop")
TimeoutE == Ev("ConnectTimeout", AnyWorker, 0, FALSE, FALSE, "none", FALSE, "normal")

\* First deliveries of what worker x can do now (at the current seq).
WorkerEvents(s, x) ==
    LET p == s.w[x]
        q == s.seq
        \* a replacement pod has heard no order: with messages its Ack answers 0
        newPod == AckE(x, TRUE, IF MessageLayer THEN 0 ELSE q, "normal")
        finishes == IF p.finished THEN {}
                    ELSE {FinishE(x, q, TRUE, "none", "normal"),
                          FinishE(x, q, FALSE, "hardware", "normal")}
                         \cup (IF s.phase = "Troubleshooting"
                               THEN {FinishE(x, q, FALSE, "container", "normal")}
                               ELSE {})
    IN  IF s.phase = "Pending" THEN
            IF p.acked THEN {LostE(x)} ELSE {AckE(x, FALSE, q, "normal")}
        ELSE IF p.restarting THEN {newPod, AckE(x, FALSE, q, "normal")}
        ELSE IF s.phase \in Checking THEN finishes \cup {LostE(x), newPod}
        ELSE IF s.phase = "RunCommand" /\ ~p.finished THEN
            {FinishE(x, q, TRUE, "none", "normal"), ErrorE(x, q, "normal"),
             HangE(x, q, TRUE), LostE(x), newPod}
            \cup (IF p.hanging THEN {} ELSE {HangE(x, q, FALSE)})
        ELSE {LostE(x), newPod}

\* Re-deliveries: heartbeats over older seqs, duplicates, stale results.
MessageEvents(s, x) ==
    LET p == s.w[x]
        q == s.seq
        okDup == p.finished \/ p.exit = "none"
        faultDup == IF okDup THEN "none"
                    ELSE IF p.exit = "container-restart" THEN "container"
                    ELSE "hardware"
    IN  (IF p.acked THEN {AckE(x, FALSE, k, "heartbeat") : k \in p.seq..q} ELSE {})
        \cup (IF p.finDone THEN {FinishE(x, q, okDup, faultDup, "duplicate")} ELSE {})
        \cup (IF p.errDone THEN {ErrorE(x, q, "duplicate")} ELSE {})
        \cup (IF q > 0
              THEN {FinishE(x, q - 1, TRUE, "none", "stale"),
                    FinishE(x, q - 1, FALSE, "hardware", "stale"),
                    ErrorE(x, q - 1, "stale")}
              ELSE {})

Events(s) ==
    IF s.phase \in Terminal THEN {}
    ELSE UNION {WorkerEvents(s, x) \cup (IF MessageLayer THEN MessageEvents(s, x) ELSE {})
                : x \in Workers}
         \cup (IF s.phase = "Pending" THEN {TimeoutE} ELSE {})
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
               /\ Deliver(FinishE(x, st.seq, TRUE, "none", "normal"))
               /\ st' # st
ComesBack(x) == /\ st.phase = "Restarting" /\ st.w[x].restarting
                /\ Deliver(AckE(x, TRUE, IF MessageLayer THEN 0 ELSE st.seq, "normal"))
                /\ st' # st
TimesOut == st.phase = "Pending" /\ Deliver(TimeoutE)

vars == st
\* Workers are interchangeable (P0.cfg: SYMMETRY Symmetry; never with -dump).
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

(* Deadlock freedom and termination.                                       *)

\* A way on other than Stop: some event changes the status (an edge cut by
\* the seq bound counts: the job goes on beyond the bound).
NoDeadlock ==
    st.phase \in Terminal
    \/ \E e \in Events(st) : e.type # "Stop" /\ Step(st, e).s # st

\* Some event other than Stop would take the job beyond the seq bound.
CutHere == \E e \in Events(st) : e.type # "Stop" /\ ~InBound(Step(st, e).s)

\* Under FairSpec every behaviour ends, or reaches the seq bound.
Termination == <>(st.phase \in Terminal \/ CutHere)

=============================================================================
