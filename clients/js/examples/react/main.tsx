// Entry point: renders <App> under <AckgateProvider> and connects. The query names what to use:
// `?ws=ws://127.0.0.1:8080/ws&client=react-app&topic=orders&limit=100` (defaults: this origin's
// /ws, "react-app", "orders", 100).
import { createRoot } from "react-dom/client";
import { StrictMode } from "react";
import { AckgateClient } from "ackgate-client";
import { AckgateProvider } from "ackgate-client/react";

import { App } from "./App.js";

const params = new URLSearchParams(location.search);
const wsUrl = params.get("ws") ?? `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
// The app owns the client: one for the page, whatever React mounts and unmounts.
const client = new AckgateClient(wsUrl, { clientId: params.get("client") ?? "react-app", storage: sessionStorage });
createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <AckgateProvider client={client}>
      <App topic={params.get("topic") ?? "orders"} limit={Number(params.get("limit") ?? 100)} />
    </AckgateProvider>
  </StrictMode>,
);
// The subscriptions wait for the session; a refusal is the state "failed", which the page shows.
client.connect().catch(() => {});
