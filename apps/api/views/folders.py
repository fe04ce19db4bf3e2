"""/v1/folders (CRUD, count, metadata, uploads, files, passages, agents), the deprecated /v1/sources aliases,
and an agent's folders and files (/v1/agents/{agent_id}/folders|sources|files...): thin adapters over
apps.folders' services and selectors.

Who may do what is decided in those services (the role matrix's ARCHIVE_CREATE / ARCHIVE_WRITE, shared with
archives, and AGENT_CONFIGURE for what changes an agent); another organisation's folder, file or agent is a
404. These patterns must come before agents' in apps/api/urls.py (static segments before ids).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.urls import re_path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.agents import selectors as agent_selectors
from apps.api.base import OrgApiView
from apps.api.serializers import agents as agent_s
from apps.api.serializers import folders as s
from apps.api.views.agents import is_sdk_v1, json_null
from apps.core.errors import InvalidInput
from apps.core.pagination import PageParams, paginate
from apps.folders import selectors, services
from apps.folders.services import check_file_size

FOLDERS_DEFAULT_LIMIT = 50
FILES_DEFAULT_LIMIT = 1000
PASSAGES_DEFAULT_LIMIT = 100
AGENT_FOLDERS_DEFAULT_LIMIT = 100
AGENT_FILES_DEFAULT_LIMIT = 100
FORM_ALLOWANCE_BYTES = 1024 * 1024
"""What an upload's body may have besides its file: the multipart framing and any form fields."""


def _page(request: Request, *, default_limit: int, default_order: str = "desc") -> PageParams:
    params = request.query_params.dict()
    params.setdefault("order", default_order)
    return PageParams.from_query(params, default_limit=default_limit)


# --- folders ---------------------------------------------------------------------------------------------


class FolderListCreateApi(OrgApiView):
    @extend_schema(
        operation_id="list_folders", parameters=[s.FolderListQueryIn], responses=s.FolderOut(many=True)
    )
    def get(self, request: Request) -> Response:
        query = s.FolderListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        qs = selectors.folder_list(actor=self.actor, name=query.validated_data.get("name"))
        page = paginate(qs, _page(request, default_limit=FOLDERS_DEFAULT_LIMIT, default_order="asc"))
        return Response(s.FolderOut(page, many=True).data)

    @extend_schema(operation_id="create_folder", request=s.FolderCreateIn, responses=s.FolderOut)
    def post(self, request: Request) -> Response:
        data = s.FolderCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        folder = services.folder_create(actor=self.actor, **data.service_kwargs())
        return Response(s.FolderOut(folder).data)


class FolderCountApi(OrgApiView):
    @extend_schema(operation_id="count_folders", responses={200: OpenApiTypes.INT})
    def get(self, request: Request) -> Response:
        return Response(selectors.folder_list(actor=self.actor).count())


class FolderMetadataApi(OrgApiView):
    class QueryIn(serializers.Serializer):
        include_detailed_per_source_metadata = s.QueryBooleanField(required=False, default=False)

    @extend_schema(
        operation_id="retrieve_metadata", parameters=[QueryIn], responses=s.OrganizationSourcesStatsOut
    )
    def get(self, request: Request) -> Response:
        query = self.QueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        stats = selectors.folder_metadata(
            actor=self.actor, detailed=query.validated_data["include_detailed_per_source_metadata"]
        )
        return Response(s.OrganizationSourcesStatsOut(stats).data)


class FolderByNameApi(OrgApiView):
    @extend_schema(operation_id="get_folder_by_name", responses={200: OpenApiTypes.STR})
    def get(self, request: Request, folder_name: str) -> Response:
        """Deprecated in Letta (use the list's `name`): the folder's id."""
        return Response(selectors.folder_by_name(actor=self.actor, name=folder_name).id)


class FolderDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_folder", responses=s.FolderOut)
    def get(self, request: Request, folder_id: str) -> Response:
        return Response(s.FolderOut(selectors.folder_get(actor=self.actor, folder_id=folder_id)).data)

    @extend_schema(operation_id="modify_folder", request=s.FolderUpdateIn, responses=s.FolderOut)
    def patch(self, request: Request, folder_id: str) -> Response:
        data = s.FolderUpdateIn(data=request.data)
        data.is_valid(raise_exception=True)
        handle = data.embedding_handle()
        if handle and handle != selectors.folder_get(actor=self.actor, folder_id=folder_id).embedding:
            raise InvalidInput(
                "A folder's embedding model cannot be changed: its files are embedded with it."
            )
        folder = services.folder_update(actor=self.actor, folder_id=folder_id, **data.service_kwargs())
        return Response(s.FolderOut(folder).data)

    @extend_schema(operation_id="delete_folder", responses={200: None})
    def delete(self, request: Request, folder_id: str) -> HttpResponse:
        services.folder_delete(actor=self.actor, folder_id=folder_id)
        return json_null()


class FolderUploadApi(OrgApiView):
    """Multipart, as the SDK sends it: the `file` part; `duplicate_handling` and `name` in the query string.
    A body past FOLDER_FILE_MAX_BYTES is a 413 by its Content-Length before it is parsed, else by the
    upload's size before it is read."""

    parser_classes = [MultiPartParser, FormParser]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        declared = request.META.get("CONTENT_LENGTH") or ""
        if declared.isdigit() and int(declared) > settings.FOLDER_FILE_MAX_BYTES + FORM_ALLOWANCE_BYTES:
            check_file_size(int(declared) - FORM_ALLOWANCE_BYTES)
        super().initial(request, *args, **kwargs)

    @extend_schema(
        operation_id="upload_file_to_folder",
        parameters=[s.UploadQueryIn],
        request={"multipart/form-data": s.UploadIn},
        responses=s.FileMetadataOut,
    )
    def post(self, request: Request, folder_id: str) -> Response:
        query = s.UploadQueryIn(data={**request.data.dict(), **request.query_params.dict()})
        query.is_valid(raise_exception=True)
        body = s.UploadIn(data=request.data)
        body.is_valid(raise_exception=True)
        upload = body.validated_data["file"]
        check_file_size(upload.size)
        result = services.file_upload(
            actor=self.actor,
            folder_id=folder_id,
            filename=upload.name,
            content_type=getattr(upload, "content_type", None),
            data=upload.read(),
            duplicate_handling=query.validated_data["duplicate_handling"],
            name=query.validated_data.get("name") or None,
        )
        response = Response(s.FileMetadataOut(result.file, context={"prefixed": not result.skipped}).data)
        if result.skipped:
            response["X-Upload-Result"] = "skipped"
        return response


class FolderAgentListApi(OrgApiView):
    @extend_schema(operation_id="list_agents_for_folder", responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, folder_id: str) -> Response:
        """The ids of the agents the folder is attached to (Letta answers ids, not agents)."""
        qs = selectors.folder_agent_list(actor=self.actor, folder_id=folder_id)
        page = paginate(qs, _page(request, default_limit=FOLDERS_DEFAULT_LIMIT))
        return Response([agent.id for agent in page])


class FolderPassageListApi(OrgApiView):
    @extend_schema(operation_id="list_folder_passages", responses=s.FolderPassageOut(many=True))
    def get(self, request: Request, folder_id: str) -> Response:
        qs = selectors.folder_chunk_list(actor=self.actor, folder_id=folder_id)
        page = paginate(qs, _page(request, default_limit=PASSAGES_DEFAULT_LIMIT))
        return Response(s.FolderPassageOut(page, many=True).data)


class FolderFileListApi(OrgApiView):
    @extend_schema(
        operation_id="list_files_for_folder",
        parameters=[s.FileListQueryIn],
        responses=s.FileMetadataOut(many=True),
    )
    def get(self, request: Request, folder_id: str) -> Response:
        query = s.FileListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        folder = selectors.folder_get(actor=self.actor, folder_id=folder_id)
        page = paginate(
            selectors.file_list(actor=self.actor, folder_id=folder.id),
            _page(request, default_limit=FILES_DEFAULT_LIMIT),
        )
        context = {}
        if query.validated_data["include_content"]:
            context["contents"] = selectors.file_texts(actor=self.actor, file_ids=[f.id for f in page])
        return Response(s.FileMetadataOut(page, many=True, context=context).data)


class FolderFileDetailApi(OrgApiView):
    @extend_schema(operation_id="retrieve_file", parameters=[s.FileListQueryIn], responses=s.FileMetadataOut)
    def get(self, request: Request, folder_id: str, file_id: str) -> Response:
        query = s.FileListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        selectors.folder_get(actor=self.actor, folder_id=folder_id)
        file = selectors.file_get(actor=self.actor, file_id=file_id, folder_id=folder_id)
        context = {}
        if query.validated_data["include_content"]:
            context["contents"] = selectors.file_texts(actor=self.actor, file_ids=[file.id])
        return Response(s.FileMetadataOut(file, context=context).data)


class FolderFileDeleteApi(OrgApiView):
    @extend_schema(operation_id="delete_file_from_folder", responses={204: None})
    def delete(self, request: Request, folder_id: str, file_id: str) -> Response:
        services.file_delete(actor=self.actor, folder_id=folder_id, file_id=file_id)
        return Response(status=204)


# --- an agent's folders and files ---------------------------------------------------------------------------


class AgentFolderListApi(OrgApiView):
    @extend_schema(operation_id="list_folders_for_agent", responses=s.FolderOut(many=True))
    def get(self, request: Request, agent_id: str) -> Response:
        qs = selectors.agent_folders(actor=self.actor, agent_id=agent_id)
        page = paginate(qs, _page(request, default_limit=AGENT_FOLDERS_DEFAULT_LIMIT))
        return Response(s.FolderOut(page, many=True).data)


class _AgentStateAnswer(OrgApiView):
    always_state = False  # the deprecated /sources paths answer the AgentState to every client

    def _answer(self, request: Request, agent_id: str) -> Response | HttpResponse:
        if is_sdk_v1(request) and not self.always_state:
            return json_null()
        agent = agent_selectors.agent_state_get(actor=self.actor, agent_id=agent_id)
        return Response(agent_s.agent_state(agent, actor=self.actor))


class AgentFolderAttachApi(_AgentStateAnswer):
    @extend_schema(operation_id="attach_folder_to_agent", request=None, responses=agent_s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, folder_id: str) -> Response | HttpResponse:
        services.agent_attach_folder(actor=self.actor, agent_id=agent_id, folder_id=folder_id)
        return self._answer(request, agent_id)


class AgentFolderDetachApi(_AgentStateAnswer):
    @extend_schema(operation_id="detach_folder_from_agent", request=None, responses=agent_s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, folder_id: str) -> Response | HttpResponse:
        services.agent_detach_folder(actor=self.actor, agent_id=agent_id, folder_id=folder_id)
        return self._answer(request, agent_id)


class AgentSourceAttachApi(AgentFolderAttachApi):
    always_state = True

    @extend_schema(operation_id="attach_source_to_agent", request=None, responses=agent_s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, folder_id: str) -> Response | HttpResponse:
        return super().patch(request, agent_id, folder_id)


class AgentSourceDetachApi(AgentFolderDetachApi):
    always_state = True

    @extend_schema(operation_id="detach_source_from_agent", request=None, responses=agent_s.AgentStateOut)
    def patch(self, request: Request, agent_id: str, folder_id: str) -> Response | HttpResponse:
        return super().patch(request, agent_id, folder_id)


class AgentFileListApi(OrgApiView):
    @extend_schema(
        operation_id="list_files_for_agent",
        parameters=[s.AgentFileListQueryIn],
        responses=s.AgentFilesPageOut,
    )
    def get(self, request: Request, agent_id: str) -> Response:
        """Letta's PaginatedAgentFiles: a page of the agent's files, with the cursor of the next page."""
        query = s.AgentFileListQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        qs = selectors.agent_file_list(
            actor=self.actor, agent_id=agent_id, is_open=query.validated_data["is_open"]
        )
        params = request.query_params.dict()
        if query.validated_data.get("cursor") and not params.get("after") and not params.get("before"):
            params["after"] = query.validated_data["cursor"]  # the deprecated cursor, an `after`
        params.setdefault("order", "desc")
        page_params = PageParams.from_query(params, default_limit=AGENT_FILES_DEFAULT_LIMIT)
        rows = paginate(
            qs, PageParams(page_params.before, page_params.after, page_params.limit + 1, page_params.order)
        )
        has_more = len(rows) > page_params.limit
        rows = rows[: page_params.limit]
        body = {"files": rows, "next_cursor": rows[-1].id if rows else None, "has_more": has_more}
        return Response(s.AgentFilesPageOut(body).data)


class AgentFileOpenApi(OrgApiView):
    @extend_schema(operation_id="open_file_for_agent", request=None, responses={200: OpenApiTypes.OBJECT})
    def patch(self, request: Request, agent_id: str, file_id: str) -> Response:
        """Open the file (whole, within the agent's per-file limit); answers the names of the files closed to
        make room (least recently used first)."""
        return Response(services.agent_file_open(actor=self.actor, agent_id=agent_id, file_id=file_id))


class AgentFileCloseApi(OrgApiView):
    @extend_schema(operation_id="close_file_for_agent", request=None, responses={200: OpenApiTypes.OBJECT})
    def patch(self, request: Request, agent_id: str, file_id: str) -> Response:
        services.agent_file_close(actor=self.actor, agent_id=agent_id, file_id=file_id)
        return Response({"message": f"File id={file_id} successfully closed"})


class AgentFileCloseAllApi(OrgApiView):
    @extend_schema(
        operation_id="close_all_files_for_agent", request=None, responses={200: OpenApiTypes.OBJECT}
    )
    def patch(self, request: Request, agent_id: str) -> Response:
        return Response(services.agent_files_close_all(actor=self.actor, agent_id=agent_id))


FOLDER = r"(?P<folder_id>[^/]+)"
FILE = r"(?P<file_id>[^/]+)"
AGENT = r"(?P<agent_id>[^/]+)"


def _folder_patterns(root: str, prefix: str) -> list[Any]:
    """The folder routes under /v1/folders (names `folder-...`) or the deprecated /v1/sources (`source-...`).
    Static segments (count, metadata, name) before {folder_id}; files/{file_id} before {file_id}."""
    return [
        re_path(rf"^v1/{root}/?$", FolderListCreateApi.as_view(), name=f"{prefix}s"),
        re_path(rf"^v1/{root}/count/?$", FolderCountApi.as_view(), name=f"{prefix}-count"),
        re_path(rf"^v1/{root}/metadata/?$", FolderMetadataApi.as_view(), name=f"{prefix}-metadata"),
        re_path(
            rf"^v1/{root}/name/(?P<folder_name>[^/]+)/?$", FolderByNameApi.as_view(), name=f"{prefix}-by-name"
        ),
        re_path(rf"^v1/{root}/{FOLDER}/?$", FolderDetailApi.as_view(), name=f"{prefix}-detail"),
        re_path(rf"^v1/{root}/{FOLDER}/upload/?$", FolderUploadApi.as_view(), name=f"{prefix}-upload"),
        re_path(rf"^v1/{root}/{FOLDER}/agents/?$", FolderAgentListApi.as_view(), name=f"{prefix}-agents"),
        re_path(
            rf"^v1/{root}/{FOLDER}/passages/?$", FolderPassageListApi.as_view(), name=f"{prefix}-passages"
        ),
        re_path(rf"^v1/{root}/{FOLDER}/files/?$", FolderFileListApi.as_view(), name=f"{prefix}-files"),
        re_path(
            rf"^v1/{root}/{FOLDER}/files/{FILE}/?$", FolderFileDetailApi.as_view(), name=f"{prefix}-file"
        ),
        re_path(
            rf"^v1/{root}/{FOLDER}/{FILE}/?$", FolderFileDeleteApi.as_view(), name=f"{prefix}-file-delete"
        ),
    ]


urlpatterns = [
    *_folder_patterns("folders", "folder"),
    *_folder_patterns("sources", "source"),
    re_path(rf"^v1/agents/{AGENT}/folders/?$", AgentFolderListApi.as_view(), name="agent-folders"),
    re_path(rf"^v1/agents/{AGENT}/sources/?$", AgentFolderListApi.as_view(), name="agent-sources"),
    re_path(
        rf"^v1/agents/{AGENT}/folders/attach/{FOLDER}/?$",
        AgentFolderAttachApi.as_view(),
        name="agent-folder-attach",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/folders/detach/{FOLDER}/?$",
        AgentFolderDetachApi.as_view(),
        name="agent-folder-detach",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/sources/attach/{FOLDER}/?$",
        AgentSourceAttachApi.as_view(),
        name="agent-source-attach",
    ),
    re_path(
        rf"^v1/agents/{AGENT}/sources/detach/{FOLDER}/?$",
        AgentSourceDetachApi.as_view(),
        name="agent-source-detach",
    ),
    re_path(rf"^v1/agents/{AGENT}/files/?$", AgentFileListApi.as_view(), name="agent-files"),
    # close-all before {file_id}: a path segment, not an id.
    re_path(
        rf"^v1/agents/{AGENT}/files/close-all/?$",
        AgentFileCloseAllApi.as_view(),
        name="agent-files-close-all",
    ),
    re_path(rf"^v1/agents/{AGENT}/files/{FILE}/open/?$", AgentFileOpenApi.as_view(), name="agent-file-open"),
    re_path(
        rf"^v1/agents/{AGENT}/files/{FILE}/close/?$", AgentFileCloseApi.as_view(), name="agent-file-close"
    ),
]
