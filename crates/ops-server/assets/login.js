"use strict";
// The login page: exchange a token for the session cookie, then open the console.
document.getElementById("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const err = document.getElementById("login-error");
  err.textContent = "";
  try {
    const res = await fetch("/api/login", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token: document.getElementById("token").value }),
    });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      err.textContent = body.message || ("login failed: " + res.status);
      return;
    }
    window.location.assign("/#/list");
  } catch (e) {
    err.textContent = "login failed: " + e;
  }
});
