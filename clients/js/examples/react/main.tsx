// Entry point: connects, then renders <App>. The query names what to use:
// `?ws=ws://127.0.0.1:8080/ws&client=react-app&topic=orders` (defaults: this origin's /ws,
// "react-app", "orders").
import { createRoot } from "react-dom/client";
import { StrictMode } from "react";
import { AckgateClient } from "ackgate-client";

import { App } from "./App.js";
import { AckgateContext } from "./useAckgate.js";

const params = new URLSearchParams(location.search);
const wsUrl = params.get("ws") ?? `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;
const client = new AckgateClient(wsUrl, { clientId: params.get("client") ?? "react-app", storage: sessionStorage });
const root = createRoot(document.getElementById("root")!);
try {
  await client.connect();
  root.render(
    <StrictMode>
      <AckgateContext.Provider value={client}>
        <App topic={params.get("topic") ?? "orders"} />
      </AckgateContext.Provider>
    </StrictMode>,
  );
} catch (error) {
  root.render(<p id="error">{String(error)}</p>);
}
