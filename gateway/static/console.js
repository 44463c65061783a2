/*
 * The gateway console (served at `/`): start a demo turn, follow a run, survive reloads
 * and gaps, browse sessions. Plain script, no build step; uses window.GatewayClient.
 *
 * Persistence (so a reload continues exactly where the page was):
 *   localStorage["gateway.console.follow"]   the followed run: id, session, last event
 *                                            id, rendered tokens, recent event rows, status
 *   localStorage["gateway.console.producer"] the page's own demo producer (run id,
 *                                            producer token, next token index): a reload
 *                                            resumes publishing while the lease is live
 *   sessionStorage["gateway.console.creds"]  API key / access token typed into the page
 *
 * URL: `/?run=<id>` follows that run (resuming from the stored cursor when it is the
 * run already followed); `/?session=<id>` follows that session: its running turn, then
 * each next turn as it starts (`./scripts/serve` points here for its demo session);
 * `?demo_delay=<ms>` sets the demo producer's pace. With none of these and nothing
 * followed before (or only an ended run), the page follows the most recently active
 * session with a running turn (else the most recently active one, else the first that
 * appears), so it opens on whatever is streaming.
 */
(function () {
  "use strict";

  const Client = window.GatewayClient;
  const BASE = ""; // same origin as the page
  const FOLLOW_KEY = "gateway.console.follow";
  const PRODUCER_KEY = "gateway.console.producer";
  const CREDS_KEY = "gateway.console.creds";
  const MAX_LOG_ROWS = 200;
  // The turns panel keeps the newest turns (as many as it loads): a session with a turn
  // every few seconds (the demo's) would otherwise grow the page without end.
  const MAX_TURN_ROWS = 20;
  const DEMO_TEXT =
    "Hello! This answer is streamed token by token through the gateway. " +
    "Each word is its own token event with its own id, so a page that reloads " +
    "mid-stream rejoins with its last event id and continues exactly, " +
    "without losing or repeating a word.";

  const $ = (sel) => document.querySelector(sel);
  const params = new URLSearchParams(location.search);

  let follower = null;
  let state = null; // the followed run (persisted)

  // ------------------------------------------------------------------ storage

  function load(store, key) {
    try {
      return JSON.parse(store.getItem(key) || "null");
    } catch (_err) {
      return null;
    }
  }
  function save(store, key, value) {
    if (value === null) store.removeItem(key);
    else store.setItem(key, JSON.stringify(value));
  }
  function persist() {
    save(localStorage, FOLLOW_KEY, state);
  }
  function creds() {
    return load(sessionStorage, CREDS_KEY) || { apiKey: "", accessToken: "" };
  }
  function readerBearer() {
    const c = creds();
    return c.apiKey || c.accessToken || null;
  }

  // ------------------------------------------------------------------ HTTP

  async function api(method, path, body, extraHeaders) {
    const headers = { Accept: "application/json", ...(extraHeaders || {}) };
    const bearer = method === "GET" ? readerBearer() : creds().apiKey;
    if (bearer) headers.Authorization = `Bearer ${bearer}`;
    // every POST says JSON, body or not: the gateway refuses other content types (415)
    if (body !== undefined || method !== "GET") headers["Content-Type"] = "application/json";
    const response = await fetch(BASE + path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const reply = await response.json().catch(() => null);
    if (!response.ok) {
      const err = new Error(`${method} ${path}: ${response.status} ${(reply && reply.error) || ""}`);
      err.status = response.status;
      err.code = reply && reply.error;
      throw err;
    }
    return reply;
  }

  // ------------------------------------------------------------------ rendering

  function message(text, isError) {
    const el = $("#message");
    el.textContent = text || "";
    el.classList.toggle("error", !!isError);
  }

  function setConnection(kind, text) {
    const el = $("#connection");
    el.dataset.state = kind;
    el.textContent = text || kind;
  }

  function setStatus(status) {
    state.status = status;
    const el = $("#run-status");
    el.dataset.status = status || "";
    el.textContent = status || "–";
  }

  function tokenNode(token, fresh) {
    const span = document.createElement("span");
    if (token.kind === "recovered") {
      span.className = "recovered";
      span.title = `recovered from the session's turn record (through ${token.id})`;
    } else if (token.kind === "missing") {
      span.className = "missing";
      span.title = "events not retained and no turn record to recover them from";
    } else {
      span.className = fresh ? "token fresh" : "token";
      span.title = token.id;
      if (fresh) setTimeout(() => span.classList.remove("fresh"), 700);
    }
    span.dataset.id = token.id || "";
    span.textContent = token.text;
    return span;
  }

  function logRow(row) {
    const tr = document.createElement("tr");
    if (row.meta) tr.className = "meta";
    for (const value of [row.id || "", row.event, row.data]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.appendChild(td);
    }
    return tr;
  }

  // The session this page follows (or the followed run's session), in the fields that
  // name one: the Session field (where a demo turn would start) and the run facts.
  function showSession(sessionId) {
    $("#run-session").textContent = sessionId || "–";
    const input = $("#session-input");
    if (sessionId && document.activeElement !== input) input.value = sessionId;
    for (const li of $("#turns").children) markFollowed(li);
  }

  function renderCursor() {
    $("#cursor").textContent = state.lastEventId || "–";
    $("#event-count").textContent = String(state.count || 0);
  }

  function renderGap() {
    const el = $("#gap-notice");
    const gap = state.gap;
    if (!gap) {
      el.hidden = true;
      el.textContent = "";
      delete el.dataset.recovered;
      return;
    }
    el.hidden = false;
    el.dataset.reason = gap.reason || "";
    el.dataset.recovered = gap.recovered ? "true" : "false";
    el.textContent =
      `Gap (${gap.reason}): events after ${gap.requested_event_id || "the start"} were no longer ` +
      `retained (earliest kept ${gap.earliest_available_event_id || "none"}). ` +
      (gap.recovered
        ? `Recovered from durable state (run ${gap.run_status}, turn ${gap.turn_state || "none"}) ` +
          `and rejoined at ${gap.latest_available_event_id || "the start"}.`
        : "Reloading run status and session turns…");
  }

  function renderAll() {
    $("#run-id").textContent = state ? state.runId : "–";
    showSession(sessionFollow || (state && state.sessionId));
    const answer = $("#answer");
    answer.replaceChildren();
    const body = $("#events tbody");
    body.replaceChildren();
    if (!state) return;
    for (const token of state.tokens) answer.appendChild(tokenNode(token, false));
    for (const row of state.log) body.appendChild(logRow(row));
    setStatus(state.status);
    renderCursor();
    renderGap();
  }

  function addLog(row) {
    state.log.push(row);
    if (state.log.length > MAX_LOG_ROWS) state.log.splice(0, state.log.length - MAX_LOG_ROWS);
    const body = $("#events tbody");
    body.appendChild(logRow(row));
    while (body.children.length > MAX_LOG_ROWS) body.removeChild(body.firstChild);
    const wrap = body.closest(".table-wrap");
    wrap.scrollTop = wrap.scrollHeight;
  }

  // ------------------------------------------------------------------ following

  function textOf(data) {
    if (typeof data === "string") return data;
    if (data && typeof data.text === "string") return data.text;
    return null;
  }

  function onEvent(ev) {
    state.lastEventId = ev.id;
    state.count = (state.count || 0) + 1;
    const text = textOf(ev.data);
    let fresh = null;
    if ((ev.event === "token" || ev.event === "text-delta") && text !== null) {
      fresh = { id: ev.id, text };
    } else if (ev.event === "text-set" && text !== null) {
      state.tokens = [];
      $("#answer").replaceChildren();
      fresh = { id: ev.id, text };
    }
    if (fresh) state.tokens.push(fresh);
    addLog({ id: ev.id, event: ev.event, data: JSON.stringify(ev.data) });
    persist(); // before the DOM: what is visible is always what a reload restores
    if (fresh) $("#answer").appendChild(tokenNode(fresh, true));
    renderCursor();
    if (state.status !== "running") setStatus("running");
  }

  function onEnd(end) {
    setStatus(end.status || "ended");
    addLog({ id: "", event: "end", data: JSON.stringify(end), meta: true });
    persist();
    setConnection("closed", `closed (run ended: ${end.status})`);
    loadSessionsSoon();
    if (sessionFollow) nextTurnSoon(sessionFollow, state.runId);
  }

  async function onGap(gap) {
    state.gap = { ...gap, recovered: false };
    addLog({ id: "", event: "gap", data: JSON.stringify(gap), meta: true });
    persist();
    renderGap();
    setConnection("recovering", "recovering from a gap");
    const durable = await Client.reloadDurableState(BASE, state.runId, { bearer: readerBearer() });
    const turn = durable.turn;
    if (turn && typeof turn.text === "string") {
      // The turn record holds the whole answer so far; it replaces what was rendered.
      state.tokens = [{ id: gap.latest_available_event_id, text: turn.text, kind: "recovered" }];
    } else {
      state.tokens.push({
        id: gap.latest_available_event_id,
        text: ` [… events up to ${gap.latest_available_event_id} not retained …] `,
        kind: "missing",
      });
    }
    state.lastEventId = gap.latest_available_event_id || null;
    state.gap = {
      ...state.gap,
      recovered: true,
      run_status: durable.run.status,
      turn_state: turn ? turn.state : null,
    };
    state.status = durable.run.status;
    persist();
    renderAll();
    if (state.sessionId) showTurns(state.sessionId, durable.turns);
    return true; // rejoin at latest_available_event_id
  }

  function onError(err) {
    if (err.code === "reconnecting") {
      setConnection("reconnecting", "reconnecting…");
    } else if (err.code === "unavailable") {
      setConnection("reconnecting", "backend unavailable, reconnecting…");
    } else {
      setConnection("closed", `closed (${err.code})`);
      message(err.detail || err.code, true);
    }
  }

  function onOpen(info) {
    if (info.attempt === 1 && info.lastEventId && state.resumed) {
      setConnection("resumed", `live, resumed after ${info.lastEventId}`);
      $("#connection").dataset.resumedFrom = info.lastEventId;
    } else {
      setConnection("live", info.lastEventId ? `live, after ${info.lastEventId}` : "live");
    }
  }

  function stopFollowing() {
    if (follower) follower.close();
    follower = null;
  }

  let followCalls = 0; // only the newest followRun opens a stream

  async function followRun(runId, { resume, keepSession } = { resume: false, keepSession: false }) {
    if (!keepSession) stopSessionFollow();
    if (keepSession && state && state.runId === runId && follower && !follower.closed) return;
    const call = ++followCalls;
    stopFollowing();
    const stored = load(localStorage, FOLLOW_KEY);
    if (resume && stored && stored.runId === runId) {
      state = { ...stored, resumed: true };
    } else {
      state = {
        runId, sessionId: null, lastEventId: null, tokens: [], log: [], count: 0,
        status: null, gap: null, resumed: false,
      };
    }
    persist();
    renderAll();
    if (new URLSearchParams(location.search).get("run") !== runId) {
      const url = new URL(location.href);
      url.searchParams.set("run", runId);
      history.replaceState(null, "", url);
    }
    if (state.status && state.status !== "running") {
      setConnection("closed", `closed (run ended: ${state.status})`);
      return; // an ended run: the stored rendering is complete
    }
    try {
      const run = await api("GET", `/v1/runs/${encodeURIComponent(runId)}`);
      state.sessionId = run.session_id;
      showSession(sessionFollow || run.session_id);
      if (!state.status) setStatus(run.status);
      persist();
    } catch (err) {
      message(err.message, true);
      setConnection("closed", "closed (run not readable)");
      return;
    }
    if (call !== followCalls || !state || state.runId !== runId) return; // another follow started meanwhile
    setConnection("connecting", state.lastEventId ? `rejoining after ${state.lastEventId}` : "connecting");
    follower = Client.follow(BASE, runId, {
      lastEventId: state.lastEventId,
      accessToken: creds().apiKey ? null : creds().accessToken || null,
      onEvent, onEnd, onGap, onError, onOpen,
      maxGapRecoveries: 3,
    });
  }

  // ------------------------------------------------------------------ following a session

  let sessionFollow = null; // the session whose turns open here one after the other
  let picked = false; // the user chose what to show: the page no longer picks for them
  let nextTurnTimer = null;
  const NEXT_TURN_POLL_MS = 1000;
  // While the session feed is live its `turn` frames open the next turn here at once;
  // the poll is then only a fallback (each poll is a request, and a line in the log).
  const NEXT_TURN_FALLBACK_MS = 15000;

  // The running turn of a session (the newest one), other than `exceptRunId`.
  async function runningTurn(sessionId, exceptRunId) {
    const reply = await api("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/turns?limit=20`);
    const running = reply.turns.filter((t) => t.state === "running" && t.run_id !== exceptRunId);
    return running.length ? running[running.length - 1].run_id : null;
  }

  async function followSessionTurns(sessionId, exceptRunId) {
    clearTimeout(nextTurnTimer);
    if (sessionFollow !== sessionId) loadTurns(sessionId); // the turns panel follows its feed
    sessionFollow = sessionId;
    $("#run").dataset.session = sessionId;
    showSession(sessionId);
    const url = new URL(location.href);
    if (url.searchParams.get("session") !== sessionId) {
      url.searchParams.set("session", sessionId);
      history.replaceState(null, "", url);
    }
    let runId = null;
    try {
      runId = await runningTurn(sessionId, exceptRunId);
    } catch (err) {
      message(`session ${sessionId}: ${err.message}`, true);
    }
    if (sessionFollow !== sessionId) return; // the user picked something else meanwhile
    if (runId) {
      message(`following session ${sessionId}: each new turn opens here`);
      await followRun(runId, { resume: true, keepSession: true });
    } else {
      if (!state || state.status !== "running") setConnection("waiting", `waiting for a turn of ${sessionId}`);
      nextTurnSoon(sessionId, exceptRunId);
    }
  }

  function feedLive(sessionId) {
    return !!sessionFeed && sessionFeed.sessionId === sessionId && $("#turns").dataset.feed === "live";
  }

  // The newest running turn the live session feed showed, other than `exceptRunId`.
  function runningTurnOfFeed(sessionId, exceptRunId) {
    if (!feedLive(sessionId)) return null;
    const rows = [...$("#turns").children].filter(
      (li) => li.dataset.state === "running" && li.dataset.runId !== exceptRunId);
    return rows.length ? rows[rows.length - 1].dataset.runId : null;
  }

  function nextTurnSoon(sessionId, exceptRunId) {
    clearTimeout(nextTurnTimer);
    const next = runningTurnOfFeed(sessionId, exceptRunId);
    if (next) {
      message(`following session ${sessionId}: each new turn opens here`);
      followRun(next, { resume: true, keepSession: true });
      return;
    }
    nextTurnTimer = setTimeout(() => {
      if (sessionFollow === sessionId) followSessionTurns(sessionId, exceptRunId);
    }, feedLive(sessionId) ? NEXT_TURN_FALLBACK_MS : NEXT_TURN_POLL_MS);
  }

  function stopSessionFollow() {
    clearTimeout(nextTurnTimer);
    sessionFollow = null;
    delete $("#run").dataset.session;
    const url = new URL(location.href);
    if (url.searchParams.has("session")) {
      url.searchParams.delete("session");
      history.replaceState(null, "", url);
    }
  }

  // The session a page with nothing to show opens on: the most recently active one with
  // a running turn, else the most recently active one (its next turn will open here).
  async function sessionToOpen() {
    const reply = await api("GET", "/v1/sessions?limit=5");
    for (const row of reply.sessions) {
      if (await runningTurn(row.session_id, null)) return row.session_id;
    }
    return reply.sessions.length ? reply.sessions[0].session_id : null;
  }

  // Until there is a session (a gateway that just started) or the user picks something.
  async function openOnLiveSession(wanted) {
    const untouched = () => !picked && !sessionFollow && (state === null || state.runId === wanted);
    while (untouched()) {
      let found = null;
      try {
        found = await sessionToOpen();
      } catch (_err) {
        return; // e.g. credentials needed: the page stays as it is
      }
      if (!untouched()) return;
      if (found) {
        await followSessionTurns(found, null);
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, NEXT_TURN_POLL_MS));
    }
  }

  // ------------------------------------------------------------------ demo producer

  function demoTokens() {
    return DEMO_TEXT.match(/\S+\s*/g);
  }

  async function startDemo(sessionId) {
    const reply = await api("POST", "/v1/runs", {
      session_id: sessionId,
      input_message: {
        messageId: `console-${Date.now()}`,
        role: "user",
        parts: [{ kind: "text", text: "Show me a streamed answer." }],
        metadata: { origin: "console" },
      },
    });
    const delay = Number(params.get("demo_delay") || 150);
    save(localStorage, PRODUCER_KEY, {
      runId: reply.run_id, sessionId: reply.session_id, token: reply.producer_token, next: 0, delay,
    });
    await followRun(reply.run_id);
    runProducer(false);
    loadSessions();
  }

  // After a reload the stored `next` may be one behind (the page can unload between a
  // publish and saving `next`): the session's turn text says exactly how many tokens
  // the gateway accepted, so a resumed producer neither repeats nor skips one.
  async function syncProducer(tokens) {
    const job = load(localStorage, PRODUCER_KEY);
    if (!job || !job.sessionId) return;
    try {
      const reply = await api("GET", `/v1/sessions/${encodeURIComponent(job.sessionId)}/turns?limit=200`);
      const turn = reply.turns.find((t) => t.run_id === job.runId);
      if (!turn) return;
      let text = "";
      for (let n = 0; n <= tokens.length; n += 1) {
        if (text === turn.text) {
          save(localStorage, PRODUCER_KEY, { ...job, next: n });
          return;
        }
        text += tokens[n] || "";
      }
    } catch (_err) {
      // keep the stored position
    }
  }

  let producing = false;
  let unloading = false;
  window.addEventListener("pagehide", () => { unloading = true; });
  async function runProducer(resumed) {
    if (producing) return;
    producing = true;
    try {
      const tokens = demoTokens();
      if (resumed) await syncProducer(tokens);
      for (;;) {
        const job = load(localStorage, PRODUCER_KEY);
        if (!job) return;
        // Numbered (token n is event n + 1 of this lease): a re-send after a reload that
        // lost the saved position is answered with its first ids, never appended twice.
        const headers = { "X-Producer-Token": job.token, "X-Producer-Seq": String(job.next + 1) };
        const path = `/v1/runs/${encodeURIComponent(job.runId)}`;
        try {
          if (job.next >= tokens.length) {
            await api("POST", `${path}/end`, { status: "success" }, headers);
            save(localStorage, PRODUCER_KEY, null);
            return;
          }
          const reply = await api("POST", `${path}/events`,
            { event: "token", data: { text: tokens[job.next] } }, headers);
          save(localStorage, PRODUCER_KEY, { ...job, next: job.next + 1 });
          if (reply.cancel_requested) {
            await api("POST", `${path}/end`, { status: "cancelled" }, headers);
            save(localStorage, PRODUCER_KEY, null);
            return;
          }
        } catch (err) {
          // A reply such as 409 fenced/ended: this page no longer produces. A failed
          // fetch (no status: network error, or the page is unloading for a reload)
          // keeps the job, so the next page load resumes it.
          if (err.status) save(localStorage, PRODUCER_KEY, null);
          if (!unloading) message(`demo producer stopped: ${err.message}`, true);
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, job.delay));
      }
    } finally {
      producing = false;
    }
  }

  // ------------------------------------------------------------------ sessions

  function turnItem(turn) {
    const li = document.createElement("li");
    li.dataset.runId = turn.run_id;
    li.dataset.state = turn.state;
    // Turns of one session often say the same thing (the demo's always do): the start
    // time and the run id tell them apart.
    const when = document.createElement("time");
    if (typeof turn.created_at === "number") {
      const started = new Date(turn.created_at * 1000);
      when.dateTime = started.toISOString();
      when.textContent = started.toLocaleTimeString();
    }
    const id = document.createElement("code");
    id.textContent = turn.run_id;
    const st = document.createElement("span");
    st.className = "state";
    st.textContent = turn.state;
    const follow = document.createElement("button");
    follow.type = "button";
    follow.textContent = "follow";
    follow.addEventListener("click", () => {
      picked = true;
      followRun(turn.run_id, { resume: true });
    });
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = turn.text || "";
    li.append(when, id, st, follow, text);
    markFollowed(li);
    return li;
  }

  // The row of the run the run panel shows.
  function markFollowed(li) {
    li.classList.toggle("followed", !!state && li.dataset.runId === state.runId);
  }

  // One row per run id, in order, at most MAX_TURN_ROWS (the oldest go first).
  function addTurnRow(turn) {
    const list = $("#turns");
    let li = turnRow(turn.run_id);
    if (li) return li;
    const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
    li = turnItem(turn);
    list.appendChild(li);
    while (list.children.length > MAX_TURN_ROWS) list.removeChild(list.firstChild);
    if (atEnd) list.scrollTop = list.scrollHeight; // the newest turn stays in view
    return li;
  }

  function showTurns(sessionId, turns) {
    $("#turns-session").textContent = sessionId;
    $("#turns").replaceChildren();
    for (const turn of turns) addTurnRow(turn);
  }

  // The selected session is followed live on one connection (the session feed), not
  // one stream per run: every turn, its text as it streams, and its END.
  let sessionFeed = null;

  function turnRow(runId) {
    for (const li of $("#turns").children) if (li.dataset.runId === runId) return li;
    return null;
  }

  function setTurnState(li, value) {
    li.dataset.state = value;
    li.querySelector(".state").textContent = value;
  }

  function followSession(sessionId) {
    if (sessionFeed) sessionFeed.close();
    const list = $("#turns");
    list.dataset.feed = "connecting";
    sessionFeed = Client.followSession(BASE, sessionId, {
      accessToken: creds().apiKey ? null : creds().accessToken || null,
      onOpen() { list.dataset.feed = "live"; },
      onTurn(turn) {
        const li = addTurnRow({ ...turn, state: "running", text: "" });
        li.querySelector(".text").textContent = ""; // the feed replays the turn from its start
        setTurnState(li, "running");
        // The run panel following this session, between turns: this one opens now.
        const idle = !state || (state.runId !== turn.run_id && state.status !== "running");
        if (sessionFollow === sessionId && idle) nextTurnSoon(sessionId, state && state.runId);
      },
      onEvent(ev) {
        const li = turnRow(ev.runId);
        const text = textOf(ev.data);
        if (!li || text === null) return;
        const node = li.querySelector(".text");
        if (ev.event === "token" || ev.event === "text-delta") node.textContent += text;
        else if (ev.event === "text-set") node.textContent = text;
      },
      onTurnEnd(end) {
        const li = turnRow(end.run_id);
        if (li) setTurnState(li, end.status);
        loadSessionsSoon();
      },
      async onGap() {
        await loadTurns(sessionId, { live: false });
        return true;
      },
      onEnd() { list.dataset.feed = "retired"; },
      onError(err) { list.dataset.feed = err.fatal ? "closed" : "reconnecting"; },
    });
  }

  async function loadTurns(sessionId, { live } = { live: true }) {
    try {
      const reply = await api("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/turns?limit=20`);
      showTurns(sessionId, reply.turns);
      if (live) followSession(sessionId);
    } catch (err) {
      message(err.message, true);
    }
  }

  // The end of a turn reaches the page twice (the run's stream and the session feed):
  // one reload of the list for both.
  let sessionsTimer = null;
  function loadSessionsSoon() {
    clearTimeout(sessionsTimer);
    sessionsTimer = setTimeout(loadSessions, 250);
  }

  async function loadSessions() {
    const list = $("#sessions");
    try {
      const reply = await api("GET", "/v1/sessions?limit=50");
      list.replaceChildren();
      for (const row of reply.sessions) {
        const li = document.createElement("li");
        li.dataset.sessionId = row.session_id;
        const id = document.createElement("code");
        id.textContent = row.session_id;
        const count = document.createElement("span");
        count.className = "count";
        const when = new Date(row.last_updated * 1000).toLocaleTimeString();
        count.textContent = `${row.turn_count} turn${row.turn_count === 1 ? "" : "s"} · ${when}`;
        li.append(id, count);
        li.addEventListener("click", () => {
          for (const other of list.children) other.classList.remove("selected");
          li.classList.add("selected");
          loadTurns(row.session_id);
        });
        list.appendChild(li);
      }
      list.dataset.loaded = "true";
    } catch (err) {
      list.dataset.loaded = "error";
      message(`sessions: ${err.message}`, true);
    }
  }

  // ------------------------------------------------------------------ wiring

  function init() {
    const c = creds();
    $("#api-key").value = c.apiKey || "";
    $("#access-token").value = c.accessToken || "";
    const saveCreds = () =>
      save(sessionStorage, CREDS_KEY, { apiKey: $("#api-key").value.trim(), accessToken: $("#access-token").value.trim() });
    $("#api-key").addEventListener("change", saveCreds);
    $("#access-token").addEventListener("change", saveCreds);

    $("#demo-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      message("");
      picked = true;
      startDemo($("#session-input").value.trim() || "console").catch((err) => message(err.message, true));
    });
    $("#follow-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      message("");
      picked = true;
      followRun($("#follow-input").value.trim(), { resume: true });
    });
    $("#refresh-sessions").addEventListener("click", loadSessions);

    const stored = load(localStorage, FOLLOW_KEY);
    const session = params.get("session");
    const wanted = params.get("run") || (stored && stored.runId);
    if (session && params.get("run")) {
      // A reload while following a session: resume its run, then go on with the session.
      sessionFollow = session;
      $("#run").dataset.session = session;
      showSession(session);
      loadTurns(session); // the turns panel follows the session's feed, as before the reload
      followRun(params.get("run"), { resume: true, keepSession: true }).then(() => {
        if (state && state.status && state.status !== "running") nextTurnSoon(session, state.runId);
      });
    } else if (session) {
      followSessionTurns(session, null);
    } else if (params.get("run") || (wanted && (!stored.status || stored.status === "running"))) {
      $("#follow-input").value = wanted;
      followRun(wanted, { resume: true });
    } else {
      if (wanted) followRun(wanted, { resume: true }); // the finished run, until a live one is found
      openOnLiveSession(wanted || null);
    }
    if (load(localStorage, PRODUCER_KEY)) runProducer(true);
    loadSessions();
  }

  window.GatewayConsole = {
    followRun, followSessionTurns, startDemo, loadSessions,
    get state() { return state; },
    get session() { return sessionFollow; },
  };
  init();
})();
