"""The caller's quota: `GET /api/v1/quota`, its token's weight, quotas and use now (docs/quotas.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.auth import tenant_of
from app.api.deps import ReadAccess, SessionDep, SettingsDep
from app.api.schemas import AUTH_ERRORS, QuotaPublic
from app.services.quotas import usage_of

router = APIRouter(prefix="/quota", tags=["quota"], responses=AUTH_ERRORS)


@router.get("", response_model=QuotaPublic, dependencies=[ReadAccess])
def read_quota(request: Request, session: SessionDep, settings: SettingsDep) -> QuotaPublic:
    """This token's fair-share weight, quotas and use now (weight 1 and no quota unless the operator set them)."""
    report = usage_of(session, tenant_of(request, settings))
    return QuotaPublic.model_validate(report, from_attributes=True)
