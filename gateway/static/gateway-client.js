/*
 * gateway-client.js: a small client for the gateway's SSE run streams, over EventSource.
 *
 * No build step, no dependency. Load it as a plain script (it defines
 * `window.GatewayClient`) or import it as an ES module / CommonJS module
 * (`globalThis.GatewayClient` is set either way). Documented in docs/client.md.
 *
 *   const follower = GatewayClient.follow("", runId, {
 *     lastEventId,                 // resume after this id (null: from the start)
 *     accessToken,                 // scoped subscriber JWT, sent as ?access_token=
 *     onEvent(ev) {},              // {id, event, data} for every data event, in order
 *     onEnd(end) {},               // {status, error?}: the run ended; the stream is closed
 *     async onGap(gap) {},         // reload durable state; the client then rejoins at
 *                                  //   gap.latest_available_event_id
 *     onError(err) {},             // {code, detail, fatal}
 *     onOpen(info) {},             // {lastEventId, attempt}: each (re)connection
 *     maxGapRecoveries: 3,         // consecutive gaps without a data event in between
 *   });
 *   follower.lastEventId           // the id of the newest event delivered to onEvent
 *   follower.close()
 *
 *   GatewayClient.followSession("", sessionId, {onTurn, onEvent, onTurnEnd, onGap, onEnd})
 *                                  // every turn of a session on one connection
 *
 * Wire rules (docs/protocol.md §4): data frames carry `id:`; `end` and `gap` carry the
 * terminal ids `end` / `gap` (never a cursor: a reconnect with one is answered 204, which
 * stops an EventSource), `unavailable` carries none. The first connection passes the
 * cursor as the `last_event_id` query
 * parameter (EventSource cannot set headers); on its own reconnects the browser sends
 * `Last-Event-ID`, which the gateway prefers over the query parameter.
 */
(function (root, factory) {
  "use strict";
  const api = factory();
  root.GatewayClient = api;
  if (typeof module === "object" && module && module.exports) {
    module.exports = api;
  }
})(typeof globalThis !== "undefined" ? globalThis : this, function () {
  "use strict";

  function streamUrl(baseUrl, runId, lastEventId, accessToken) {
    const base = String(baseUrl || "").replace(/\/+$/, "");
    const params = new URLSearchParams();
    if (lastEventId) params.set("last_event_id", lastEventId);
    if (accessToken) params.set("access_token", accessToken);
    const query = params.toString();
    return `${base}/v1/runs/${encodeURIComponent(runId)}/stream${query ? "?" + query : ""}`;
  }

  function parse(text) {
    if (text === undefined || text === null || text === "") return null;
    try {
      return JSON.parse(text);
    } catch (_err) {
      return text;
    }
  }

  /**
   * Follow one run. Returns a follower: `{close(), lastEventId, closed, runId}`.
   *
   * Data events are delivered to `onEvent` once each, in order; the follower tracks the
   * last id itself, so after a gap or a reopen it resumes exactly there. Event names are
   * the producer's: every frame name other than `end`, `gap` and `unavailable` is
   * treated as a data event, but EventSource only dispatches names it has a listener
   * for, so pass `eventNames` when the producer uses names beyond the defaults
   * (`message`, `token`, `text-delta`, `text-set`, `state`, `status`, `artifact`,
   * `history`, `metadata`, `values`, `updates`, `messages`, `custom`, `ui`).
   */
  function follow(baseUrl, runId, options) {
    const opts = options || {};
    const EventSourceImpl = opts.EventSource || globalThis.EventSource;
    if (typeof EventSourceImpl !== "function") {
      throw new Error("GatewayClient.follow: no EventSource implementation available");
    }
    const maxGapRecoveries = opts.maxGapRecoveries === undefined ? 3 : opts.maxGapRecoveries;
    const eventNames = new Set([
      "message", "token", "text-delta", "text-set", "state", "status", "artifact",
      "history", "metadata", "values", "updates", "messages", "custom", "ui",
      ...(opts.eventNames || []),
    ]);
    const noop = function () {};
    const onEvent = opts.onEvent || noop;
    const onEnd = opts.onEnd || noop;
    const onGap = opts.onGap || noop;
    const onError = opts.onError || noop;
    const onOpen = opts.onOpen || noop;

    let source = null;
    let attempt = 0;
    let gapsInARow = 0;
    const follower = {
      runId,
      lastEventId: opts.lastEventId || null,
      closed: false,
      close() {
        follower.closed = true;
        if (source) source.close();
        source = null;
      },
    };

    function fail(code, detail) {
      follower.close();
      onError({ code, detail, fatal: true });
    }

    function open() {
      if (follower.closed) return;
      attempt += 1;
      const es = new EventSourceImpl(
        streamUrl(baseUrl, runId, follower.lastEventId, opts.accessToken),
        opts.withCredentials ? { withCredentials: true } : undefined,
      );
      source = es;
      const cursorAtOpen = follower.lastEventId;
      es.onopen = function () {
        if (source === es) onOpen({ lastEventId: cursorAtOpen, attempt });
      };

      function onData(msg) {
        if (source !== es) return; // a frame from a stream we already left
        if (msg.lastEventId) follower.lastEventId = msg.lastEventId;
        gapsInARow = 0;
        onEvent({ id: msg.lastEventId || null, event: msg.type, data: parse(msg.data) });
      }
      for (const name of eventNames) es.addEventListener(name, onData);

      es.addEventListener("end", function (msg) {
        if (source !== es) return;
        follower.close();
        onEnd(parse(msg.data) || {});
      });

      es.addEventListener("gap", function (msg) {
        if (source !== es) return;
        es.close();
        source = null;
        const gap = parse(msg.data) || {};
        gapsInARow += 1;
        if (gapsInARow > maxGapRecoveries) {
          fail("gap_recovery_exhausted", `gave up after ${maxGapRecoveries} gap recoveries`);
          return;
        }
        Promise.resolve()
          .then(function () { return onGap(gap, { attempt: gapsInARow }); })
          .then(
            function (verdict) {
              if (follower.closed || verdict === false) {
                follower.close();
                return;
              }
              // Rejoin after the newest retained entry: the durable state just reloaded
              // stands for everything up to it.
              follower.lastEventId = gap.latest_available_event_id || null;
              open();
            },
            function (err) {
              fail("gap_recovery_failed", String((err && err.message) || err));
            },
          );
      });

      // The backend failed on the gateway's side; the response ends without `end`.
      // EventSource reconnects by itself after `retry:` (with Last-Event-ID once this
      // connection delivered an event, else with the same query cursor): let it.
      es.addEventListener("unavailable", function (msg) {
        if (source !== es) return;
        onError({ code: "unavailable", detail: parse(msg.data), fatal: false });
      });

      es.onerror = function () {
        if (source !== es) return;
        if (es.readyState === 2 /* CLOSED: HTTP error, not retried by EventSource */) {
          source = null;
          fail("stream_failed", "the stream could not be opened (HTTP error or wrong content type)");
        } else {
          onError({ code: "reconnecting", detail: null, fatal: false });
        }
      };
    }

    open();
    return follower;
  }

  function sessionStreamUrl(baseUrl, sessionId, lastEventId, accessToken) {
    const base = String(baseUrl || "").replace(/\/+$/, "");
    const params = new URLSearchParams();
    if (lastEventId) params.set("last_event_id", lastEventId);
    if (accessToken) params.set("access_token", accessToken);
    const query = params.toString();
    return `${base}/v1/sessions/${encodeURIComponent(sessionId)}/stream${query ? "?" + query : ""}`;
  }

  /**
   * Follow every turn of a session on one connection (the session feed). Returns
   * `{close(), lastEventId, closed, sessionId}`; `lastEventId` is a session cursor.
   *
   *   onTurn({run_id, input_message, created_at})   a turn opens
   *   onEvent({id, runId, event, data})              the turn's run events, in order
   *   onTurnEnd({run_id, status, error?})            the turn's run ended
   *   async onGap(gap)                               reload the turns; the client then
   *                                                  rejoins the turn at the gap's newest
   *                                                  retained event (or the next turn)
   *   onEnd({status: "retired", session_id})         the session was retired; closed
   *   onError(err), onOpen(info)                     as for `follow`
   */
  function followSession(baseUrl, sessionId, options) {
    const opts = options || {};
    const EventSourceImpl = opts.EventSource || globalThis.EventSource;
    if (typeof EventSourceImpl !== "function") {
      throw new Error("GatewayClient.followSession: no EventSource implementation available");
    }
    const maxGapRecoveries = opts.maxGapRecoveries === undefined ? 3 : opts.maxGapRecoveries;
    const eventNames = new Set([
      "message", "token", "text-delta", "text-set", "state", "status", "artifact",
      "history", "metadata", "values", "updates", "messages", "custom",
      ...(opts.eventNames || []),
    ]);
    const noop = function () {};
    const onTurn = opts.onTurn || noop;
    const onEvent = opts.onEvent || noop;
    const onTurnEnd = opts.onTurnEnd || noop;
    const onGap = opts.onGap || noop;
    const onEnd = opts.onEnd || noop;
    const onError = opts.onError || noop;
    const onOpen = opts.onOpen || noop;

    let source = null;
    let attempt = 0;
    let gapsInARow = 0;
    const follower = {
      sessionId,
      lastEventId: opts.lastEventId || null,
      closed: false,
      close() {
        follower.closed = true;
        if (source) source.close();
        source = null;
      },
    };

    function runOf(cursor) {
      const cut = String(cursor || "").indexOf("/");
      return cut < 0 ? null : cursor.slice(0, cut);
    }

    function open() {
      if (follower.closed) return;
      attempt += 1;
      const es = new EventSourceImpl(
        sessionStreamUrl(baseUrl, sessionId, follower.lastEventId, opts.accessToken),
        opts.withCredentials ? { withCredentials: true } : undefined,
      );
      source = es;
      const cursorAtOpen = follower.lastEventId;
      es.onopen = function () {
        if (source === es) onOpen({ lastEventId: cursorAtOpen, attempt });
      };
      function mine(msg) {
        if (source !== es) return false;
        if (msg.lastEventId) follower.lastEventId = msg.lastEventId;
        return true;
      }
      es.addEventListener("turn", function (msg) {
        if (mine(msg)) onTurn(parse(msg.data) || {});
      });
      es.addEventListener("turn_end", function (msg) {
        if (mine(msg)) onTurnEnd(parse(msg.data) || {});
      });
      function onData(msg) {
        if (!mine(msg)) return;
        gapsInARow = 0;
        onEvent({
          id: msg.lastEventId || null,
          runId: runOf(msg.lastEventId),
          event: msg.type,
          data: parse(msg.data),
        });
      }
      for (const name of eventNames) es.addEventListener(name, onData);

      es.addEventListener("end", function (msg) {
        if (source !== es) return;
        follower.close();
        onEnd(parse(msg.data) || {});
      });

      es.addEventListener("gap", function (msg) {
        if (source !== es) return;
        es.close();
        source = null;
        const gap = parse(msg.data) || {};
        gapsInARow += 1;
        if (gapsInARow > maxGapRecoveries) {
          follower.close();
          onError({ code: "gap_recovery_exhausted", detail: null, fatal: true });
          return;
        }
        Promise.resolve()
          .then(function () { return onGap(gap, { attempt: gapsInARow }); })
          .then(
            function (verdict) {
              if (follower.closed || verdict === false) {
                follower.close();
                return;
              }
              follower.lastEventId = gap.latest_available_event_id
                ? `${gap.run_id}/${gap.latest_available_event_id}`
                : `${gap.run_id}/end`;
              open();
            },
            function (err) {
              follower.close();
              onError({ code: "gap_recovery_failed", detail: String(err), fatal: true });
            },
          );
      });

      es.addEventListener("unavailable", function (msg) {
        if (source !== es) return;
        onError({ code: "unavailable", detail: parse(msg.data), fatal: false });
      });

      es.onerror = function () {
        if (source !== es) return;
        if (es.readyState === 2) {
          follower.close();
          onError({ code: "stream_failed", detail: null, fatal: true });
        } else {
          onError({ code: "reconnecting", detail: null, fatal: false });
        }
      };
    }

    open();
    return follower;
  }

  /** Fetch JSON from the gateway (GET by default); throws on a non-2xx reply. */
  async function getJson(baseUrl, path, options) {
    const opts = options || {};
    const headers = { Accept: "application/json" };
    if (opts.bearer) headers.Authorization = `Bearer ${opts.bearer}`;
    const base = String(baseUrl || "").replace(/\/+$/, "");
    const response = await fetch(base + path, { headers });
    const body = await response.json().catch(function () { return null; });
    if (!response.ok) {
      const err = new Error(`GET ${path}: ${response.status} ${(body && body.error) || ""}`);
      err.status = response.status;
      err.body = body;
      throw err;
    }
    return body;
  }

  /**
   * The recovery the protocol asks for after a gap: reload the run record and, when the
   * run belongs to a session, that session's turns. Resolves to `{run, turns, turn}`
   * (`turn` is this run's turn record, or null).
   */
  async function reloadDurableState(baseUrl, runId, options) {
    const run = await getJson(baseUrl, `/v1/runs/${encodeURIComponent(runId)}`, options);
    let turns = [];
    if (run && run.session_id) {
      const path = `/v1/sessions/${encodeURIComponent(run.session_id)}/turns`;
      try {
        turns = (await getJson(baseUrl, path, options)).turns || [];
      } catch (_err) {
        turns = [];
      }
    }
    const turn = turns.find(function (t) { return t.run_id === runId; }) || null;
    return { run, turns, turn };
  }

  return {
    follow, followSession, streamUrl, sessionStreamUrl, getJson, reloadDurableState,
    version: "1",
  };
});
