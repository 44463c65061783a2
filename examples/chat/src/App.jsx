// The chat page: the AI SDK's useChat on the gateway, through @gateway/ai's transport
// (docs/client.md, "The npm package").
//
// - A chat is a gateway session; its id is in the URL (?chat=), so a reload reopens it.
// - GatewayChatTransport sends through the app's /api/chat and follows the answer on the
//   gateway: a dropped stream resumes from its last event id (online or not), stop()
//   cancels the turn on the gateway, and useChat({resume: true}) picks up a running turn.
// - History: transport.loadMessages(id), the gateway's UIMessage[] for the chat.
// - Another tab (or device) starting a turn: the session feed says so, and this page loads
//   the new user message and resumes the answer.
import { Chat, useChat } from "@ai-sdk/react";
import { GatewayChatTransport } from "@gateway/ai/client";
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

// The app's server names the gateway and gives this page a short reader token for this
// chat only, after checking that the chat is this user's (the API key stays on the server).
async function fetchAccess(chatId) {
  const response = await fetch(`/api/access?chat=${encodeURIComponent(chatId)}`);
  if (!response.ok) throw new Error(`access: ${response.status} ${await response.text()}`);
  return response.json(); // {gatewayUrl, token}
}

async function openChat(id) {
  const transport = new GatewayChatTransport({ api: "/api/chat", access: fetchAccess });
  const chat = new Chat({ id, messages: await transport.loadMessages(id), transport });
  return { chat, transport };
}

// The transport retries a lost stream for 30 s; a page offline for longer shows the error
// and resumes when the browser is online again.
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
function useFollowSession(chat, transport) {
  useEffect(() => {
    let feed;
    let closed = false;
    void transport.access(chat.id).then(({ gatewayUrl, token }) => {
      if (closed) return;
      const url = new URL(`${gatewayUrl}/v1/sessions/${encodeURIComponent(chat.id)}/stream`);
      if (token) url.searchParams.set("access_token", token);
      feed = new EventSource(url);
      feed.addEventListener("turn", async (event) => {
        const { input_message: input } = JSON.parse(event.data);
        if (busy(chat) || hasMessage(chat, input?.messageId)) return;
        chat.messages = await transport.loadMessages(chat.id);
        if (!busy(chat)) await chat.resumeStream();
      });
      feed.addEventListener("turn_end", async (event) => {
        const { run_id: runId } = JSON.parse(event.data);
        if (busy(chat) || hasMessage(chat, runId)) return;
        chat.messages = await transport.loadMessages(chat.id);
      });
      feed.addEventListener("end", () => feed.close()); // the session was retired
    });
    return () => {
      closed = true;
      feed?.close();
    };
  }, [chat, transport]);
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

function ChatView({ chat, transport }) {
  // `chat`, not `id` + `transport`: @ai-sdk/react 3 wraps an options transport in one
  // that drops `resumeStreamIsReplay`, so a resume after a network drop appends the
  // replay to the partial answer (the answer twice). A Chat built with the transport
  // keeps it; @ai-sdk/react 4 fixed the wrapper, and this form works on both.
  const { messages, status, error, sendMessage, stop } = useChat({ chat, resume: true });
  const [draft, setDraft] = useState("");
  useResumeWhenOnline(chat);
  useFollowSession(chat, transport);

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
        <button id="stop" type="button" onClick={() => void stop()} disabled={status !== "streaming"}>
          Stop
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
  return <ChatView chat={opened.chat} transport={opened.transport} />;
}
