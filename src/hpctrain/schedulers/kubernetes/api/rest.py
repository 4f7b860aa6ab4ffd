"""The API server's answers as plain JSON (dicts), through the official client's ApiClient but without its generated
API classes and models.

The generated CoreV1Api module alone is 4.4 MB of validated methods that import some 270 pydantic models: building
it cost every fresh `hpctrain cluster`, `status` and `check` about 0.6 CPU s, and decoding an answer into models
costs more than reading its JSON. The views and checks read a few fields of each object, so they ask the ApiClient
for the JSON (the kubeconfig's server, credentials and TLS as the client sets them up; client.py's timeouts, size
cap and one-line errors) and read it as dicts. Answers of the wrong shape are refused as the client's own decoding
would refuse them (answers.json_answer); HTTP errors are client.py's KubernetesApiError (an ApiException, so
`err.status` works as before). Writes (create, patch, delete) and `logs -f` keep the generated APIs.

Both generations of the client are served: openapi-generator 7's (kubernetes 35 and later: param_serialize, then
call_api) and the older one (kubernetes 30-34: call_api, which raises for an HTTP error itself).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

from hpctrain.errors import redact
from hpctrain.schedulers.kubernetes.api import client as k8s_client, answers

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
AUTH = ["BearerToken"]  # the client's one auth setting: the kubeconfig's token (or its exec plugin's), refreshed


def path(*parts: str) -> str:
    """`/api/v1/namespaces/NS/pods`: each part (a name from the user or the server) quoted as one path segment."""
    return "/" + "/".join(quote(p, safe="") for p in parts)


class RawApi:
    """GET objects and lists as JSON dicts from the API server of `api_client` (a kubernetes.client.ApiClient)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    @property
    def server(self) -> str:
        pool = getattr(self.api_client.rest_client, "pool_manager", None)
        return getattr(pool, "server", None) or redact(self.api_client.configuration.host)

    def get(self, where: str, what: str, **query: Any) -> dict[str, Any]:
        """The object at `where` (path()); an HTTP error is a KubernetesApiError saying `what` failed."""
        return self._get(where, what, list(query.items()), listing=False)

    def list(self, where: str, what: str, **query: Any) -> list[dict[str, Any]]:
        """Every item of the list at `where` (see `pages`). `query`: labelSelector, fieldSelector, ..."""
        return [item for page in self.pages(where, what, **query) for item in page]

    def pages(self, where: str, what: str, **query: Any) -> Iterator[list[dict[str, Any]]]:
        """The list at `where`, a page of client.PAGE_SIZE items at a time (`limit`/`continue`, as kubectl's
        --chunk-size), each page yielded as it arrives: a 10,000-node cluster answers in pages the server serves
        from its cache, each decoded on its own and never one answer over the size cap, and a caller that sums
        them keeps none. The list must progress: a `continue` token that the server gave before is a wrong answer
        (it would be asked for the same pages for ever), and all pages together get Limits.list_deadline_s."""
        import time

        limits = getattr(getattr(self.api_client.rest_client, "pool_manager", None), "limits", None)
        limits = limits or k8s_client.Limits.from_environ()
        deadline = time.monotonic() + limits.list_deadline_s
        token: str | None = None
        seen: set[str] = set()
        for count in itertools.count(1):
            asked = [("limit", k8s_client.PAGE_SIZE), *([("continue", token)] if token else []), *query.items()]
            page = self._get(where, what, asked, listing=True)
            yield page["items"]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            if token in seen:
                raise answers.bad_answer(
                    self.server,
                    f"{what}: page {count + 1} would be asked with a continue token an earlier page gave, so the "
                    "list would never end",
                )
            seen.add(token)
            if time.monotonic() > deadline:
                raise k8s_client.UserError(
                    f"the Kubernetes API server {self.server} did not finish {what} within "
                    f"{limits.list_deadline_s:g} s ({count} pages of {k8s_client.PAGE_SIZE}, and it offers more): "
                    f"{k8s_client.FIX} (or allow more time: {k8s_client.TIMEOUT_ENV}=SECONDS; a list gets "
                    f"{k8s_client.ANSWER_DEADLINE_FACTOR * k8s_client.LIST_DEADLINE_FACTOR} times that)"
                )

    def stream(self, where: str, what: str, **query: Any) -> Any:
        """The answer at `where` unread (a urllib3 response: `.stream()`, `.release_conn()`), for a pod's log."""
        return self._send("GET", where, list(query.items()), what, read=False)

    def _get(self, where: str, what: str, query: list[tuple[str, Any]], listing: bool) -> dict[str, Any]:
        response = self._send("GET", where, query, what)
        parts = where.rstrip("/").split("/")  # .../pods (a list) or .../pods/NAME (an object): the kind it holds
        resource = parts[-1] if listing else parts[-2] if len(parts) > 2 else None
        return answers.json_answer(
            self.server, response.headers.get("content-type"), response.data, listing=listing, resource=resource
        )

    def _send(self, method: str, where: str, query: list[tuple[str, Any]], what: str, read: bool = True) -> Any:
        """The urllib3 response (read whole, within client.py's bounds, when `read`); an HTTP error raised as
        KubernetesApiError."""
        from kubernetes.client.rest import ApiException

        api = self.api_client
        headers = {"Accept": "application/json"}
        target = f"{where}?{urlencode(query)}" if query else where  # in the URL for both generations
        try:
            if hasattr(api, "param_serialize"):  # openapi-generator 7 (kubernetes >= 35)
                request = api.param_serialize(method, target, header_params=headers, auth_settings=AUTH)
                response = api.call_api(*request)
                if not 200 <= response.status <= 299:
                    error = ApiException(status=response.status, reason=response.reason)
                    error.body, error.headers = response.read().decode("utf-8", "replace"), response.headers
                    raise error
                if read:
                    response.read()
                return response.response
            response = api.call_api(  # the legacy generator: an HTTP error is raised by its REST layer
                target,
                method,
                header_params=headers,
                auth_settings=AUTH,
                _preload_content=False,
                _return_http_data_only=True,
            )
            if read:
                response.data  # read now, within the bounds
            return response
        except ApiException as err:
            if isinstance(err, k8s_client.UserError):
                raise
            raise k8s_client._error_class()(err, what) from None

    # ---- exec: the websocket stream of `kubectl exec` -----------------------------------------------------------

    def exec_stream(self, namespace: str, pod: str, query: Iterable[tuple[str, Any]]) -> Any:
        """The client's WSClient of an exec into `pod` (kubernetes.stream's websocket, not yet run), opened straight
        from the ApiClient's configuration and credentials: no generated API method, no swapping of the client's
        request function, so threads may share this client."""
        from kubernetes.stream import ws_client

        api = self.api_client
        where = path("api", "v1", "namespaces", namespace, "pods", pod, "exec")
        headers: dict[str, str] = {}
        if hasattr(api, "param_serialize"):
            _, url, headers, _, _ = api.param_serialize("GET", where, header_params=headers, auth_settings=AUTH)
        else:
            api.update_params_for_auth(headers, [], AUTH)
            url = api.configuration.host + where
        return ws_client.websocket_call(
            api.configuration, "GET", url, query_params=list(query), headers=headers, _preload_content=False
        )
