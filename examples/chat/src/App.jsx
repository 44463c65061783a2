// The chat page: the AI SDK's useChat on the gateway (docs/client.md, "AI SDK").
//
// - A chat is a gateway session; its id is in the URL (?chat=), so a reload reopens it.
// - History: GET /v1/sessions/{id}/ui-messages, handed to the Chat as its first messages.
//   A running turn is listed without its answer; the resume below brings that.
// - Resume on load: useChat({chat, resume: true}) asks the gateway's ui-stream, which
//   replays the running turn from its first chunk (204 when nothing runs).
// - After a network drop: resumeStream() when the browser is back online.
// - Another tab (or device) starting a turn: the session feed says so, and this page loads
//   the new user message and resumes the answer from the ui-stream.
import { Chat, useChat } from "@ai-sdk/react";
import { DefaultChatTransport } from "ai";
import { useEffect, useState } from "react";

function chatIdFromUrl() {
  const url = new URL(window.location.href);
  let id = url.searchParams.get("chat");
  if (!id) {
    id = `chat-${crypto.randomUUID()}`;
    url.searchParams.set("chat", id);
    window.history.replaceState(null, "", url);
  }
  return id;
}

const sessionUrl = (access, id, route) =>
  `${access.gateway}/v1/sessions/${encodeURIComponent(id)}/${route}`;

async function loadHistory(access, id) {
  const response = await fetch(sessionUrl(access, id, "ui-messages"), {
    headers: { Authorization: `Bearer ${access.token}` },
  });
  if (!response.ok) {
    throw new Error(`history: ${response.status} ${await response.text()}`);
  }
  return response.json(); // UIMessage[], oldest first
}

async function openChat(id) {
  // The app's server names the gateway and gives this page a subscriber token for this
  // chat only (the API key stays on the server).
  const response = await fetch(`/api/access?chat=${encodeURIComponent(id)}`);
  if (!response.ok) throw new Error(`access: ${response.status} ${await response.text()}`);
  const access = await response.json();
  const chat = new Chat({
    id,
    messages: await loadHistory(access, id),
    transport: new DefaultChatTransport({
      api: "/api/chat", // the app's own route (server.mjs): it produces the answer
      prepareReconnectToStreamRequest: ({ id: chatId }) => ({
        api: sessionUrl(access, chatId, "ui-stream"),
        headers: { Authorization: `Bearer ${access.token}` },
      }),
    }),
  });
  return { chat, access };
}

// A page that lost its answer stream (offline, a proxy cut) resumes when the browser is
// online again; the gateway replays the turn from its first chunk.
function useResumeWhenOnline(chat) {
  useEffect(() => {
    const onOnline = () => {
      if (chat.status === "error") void chat.resumeStream();
    };
    window.addEventListener("online", onOnline);
    return () => window.removeEventListener("online", onOnline);
  }, [chat]);
}

const hasMessage = (chat, id) => id != null && chat.messages.some((m) => m.id === id);
const busy = (chat) => chat.status === "submitted" || chat.status === "streaming";

// useChat resumes only on mount: a page opened before a turn starts would never see it.
// The session feed announces every turn: on a turn this page did not start, load the
// new user message and resume the answer; on a turn's end that this page has no answer
// for (its resume came too late), reload the history.
function useFollowSession(chat, access) {
  useEffect(() => {
    const url = new URL(sessionUrl(access, chat.id, "stream"));
    url.searchParams.set("access_token", access.token);
    const feed = new EventSource(url);
    feed.addEventListener("turn", async (event) => {
      const { input_message: input } = JSON.parse(event.data);
      if (busy(chat) || hasMessage(chat, input?.messageId)) return;
      chat.messages = await loadHistory(access, chat.id);
      if (!busy(chat)) await chat.resumeStream();
    });
    feed.addEventListener("turn_end", async (event) => {
      const { run_id: runId } = JSON.parse(event.data);
      if (busy(chat) || hasMessage(chat, runId)) return;
      chat.messages = await loadHistory(access, chat.id);
    });
    feed.addEventListener("end", () => feed.close()); // the session was retired
    return () => feed.close();
  }, [chat, access]);
}

function Message({ message }) {
  const text = message.parts
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");
  const meta = message.metadata ?? {};
  const turnError = meta.error?.message ?? (meta.error ? JSON.stringify(meta.error) : null);
  return (
    <li
      className="message"
      data-role={message.role}
      data-id={message.id}
      data-status={meta.status ?? ""}
    >
      <span className="text">{text}</span>
      {message.role === "assistant" && meta.status && meta.status !== "success" ? (
        <span className="meta">
          {meta.status}
          {turnError ? <span className="turn-error">: {turnError}</span> : null}
        </span>
      ) : null}
    </li>
  );
}

function ChatView({ chat, access }) {
  // `chat`, not `id` + `transport`: @ai-sdk/react 3 wraps an options transport in one
  // that drops `resumeStreamIsReplay`, so a resume after a network drop appends the
  // replay to the partial answer (the answer twice). A Chat built with the transport
  // keeps it; @ai-sdk/react 4 fixed the wrapper, and this form works on both.
  const { messages, status, error, sendMessage } = useChat({ chat, resume: true });
  const [draft, setDraft] = useState("");
  useResumeWhenOnline(chat);
  useFollowSession(chat, access);

  const send = (event) => {
    event.preventDefault();
    if (!draft.trim()) return;
    void sendMessage({ text: draft });
    setDraft("");
  };
  return (
    <main>
      <header>
        <h1>Chat {chat.id}</h1>
        <span id="status" data-status={status}>
          {status}
        </span>
      </header>
      <ol id="messages">
        {messages.map((message) => (
          <Message key={message.id} message={message} />
        ))}
      </ol>
      {status === "error" && error ? <p id="error">{error.message}</p> : null}
      <form onSubmit={send}>
        <input
          id="prompt"
          value={draft}
          placeholder="Say something"
          onChange={(event) => setDraft(event.target.value)}
        />
        <button id="send" type="submit" disabled={status === "submitted" || status === "streaming"}>
          Send
        </button>
      </form>
    </main>
  );
}

export function App() {
  const [opened, setOpened] = useState(null);
  const [failure, setFailure] = useState(null);
  useEffect(() => {
    openChat(chatIdFromUrl()).then(setOpened, (err) => setFailure(String(err)));
  }, []);
  if (failure) return <p id="load-error">{failure}</p>;
  if (!opened) return <p id="loading">Loading…</p>;
  return <ChatView chat={opened.chat} access={opened.access} />;
}
