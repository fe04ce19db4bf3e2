"""The base view every /v1 view inherits: authenticated, with the Actor resolved once."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.views import APIView

from apps.core.actor import Actor


class OrgApiView(APIView):
    actor: Actor

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.actor = request.auth  # set by our authentication classes; IsAuthenticated ran already
