"use client";
// The chat page: useChat with @gateway/ai's transport. The answer is read from the gateway,
// resumed after a reload or any dropped stream; Stop cancels the turn on the gateway.
import { Chat, useChat } from "@ai-sdk/react";
import { GatewayChatTransport } from "@gateway/ai/client";
import { useEffect, useState } from "react";

async function fetchAccess(chatId) {
  const response = await fetch(`/api/access?chat=${encodeURIComponent(chatId)}`);
  if (!response.ok) throw new Error(`access: ${response.status}`);
  return response.json(); // {gatewayUrl, token}
}

async function openChat() {
  const url = new URL(window.location.href);
  const id = url.searchParams.get("chat") ?? `chat-${crypto.randomUUID()}`;
  url.searchParams.set("chat", id);
  window.history.replaceState(null, "", url);
  const transport = new GatewayChatTransport({ api: "/api/chat", access: fetchAccess });
  return new Chat({ id, messages: await transport.loadMessages(id), transport });
}

function ChatView({ chat }) {
  const { messages, status, error, sendMessage, stop } = useChat({ chat, resume: true });
  const [draft, setDraft] = useState("");
  const send = (event) => {
    event.preventDefault();
    if (draft.trim()) void sendMessage({ text: draft });
    setDraft("");
  };
  return (
    <main>
      <span id="status" data-status={status}>{status}</span>
      <ol id="messages">
        {messages.map((m) => (
          <li key={m.id} className="message" data-role={m.role} data-id={m.id} data-status={m.metadata?.status ?? ""}>
            <span className="text">{m.parts.filter((p) => p.type === "text").map((p) => p.text).join("")}</span>
          </li>
        ))}
      </ol>
      {status === "error" && error ? <p id="error">{error.message}</p> : null}
      <form onSubmit={send}>
        <input id="prompt" value={draft} onChange={(e) => setDraft(e.target.value)} />
        <button id="send" type="submit" disabled={status === "submitted" || status === "streaming"}>Send</button>
        <button id="stop" type="button" onClick={() => void stop()} disabled={status !== "streaming"}>Stop</button>
      </form>
    </main>
  );
}

export default function Page() {
  const [chat, setChat] = useState(null);
  const [failure, setFailure] = useState(null);
  useEffect(() => void openChat().then(setChat, (err) => setFailure(String(err))), []);
  if (failure) return <p id="load-error">{failure}</p>;
  return chat ? <ChatView chat={chat} /> : <p id="loading">Loading…</p>;
}
