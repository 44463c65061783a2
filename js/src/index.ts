export * from "./server.js";
export { createResumableStreamContext } from "./resumable.js";
export type { CreateResumableStreamContextOptions, ResumableStreamContext } from "./resumable.js";
export { GatewayChatTransport } from "./client.js";
export type { GatewayAccess, GatewayChatTransportOptions } from "./client.js";
