"""factory_boy factories. Tenant models are created through the unscoped default manager."""

from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from apps.accounts.models import Membership, Organization, User
from apps.agents.models import Agent, Message
from apps.core.actor import Role
from apps.llm.models import Provider
from apps.memory.models import Archive, Block, Passage
from apps.tools.models import Tool


class OrganizationFactory(DjangoModelFactory):
    class Meta:
        model = Organization

    name = factory.Sequence(lambda n: f"org {n}")


class UserFactory(DjangoModelFactory):
    class Meta:
        model = User

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("pw-for-tests-1")


class MembershipFactory(DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    organization = factory.SubFactory(OrganizationFactory)
    role = Role.OWNER


class OrgOwnedFactory(DjangoModelFactory):
    class Meta:
        abstract = True

    organization = factory.SubFactory(OrganizationFactory)

    @classmethod
    def _get_manager(cls, model_class):
        return model_class.all_objects


class BlockFactory(OrgOwnedFactory):
    class Meta:
        model = Block

    label = factory.Sequence(lambda n: f"block{n}")
    value = "some value"
    limit = 1000


class AgentFactory(OrgOwnedFactory):
    class Meta:
        model = Agent

    name = factory.Sequence(lambda n: f"agent {n}")
    model = "openai/gpt-4o-mini"


class ToolFactory(OrgOwnedFactory):
    class Meta:
        model = Tool

    name = factory.Sequence(lambda n: f"tool_{n}")


class ArchiveFactory(OrgOwnedFactory):
    class Meta:
        model = Archive

    name = factory.Sequence(lambda n: f"archive {n}")


class PassageFactory(OrgOwnedFactory):
    class Meta:
        model = Passage

    archive = factory.SubFactory(ArchiveFactory, organization=factory.SelfAttribute("..organization"))
    text = "a passage"


class MessageFactory(OrgOwnedFactory):
    class Meta:
        model = Message

    agent = factory.SubFactory(AgentFactory, organization=factory.SelfAttribute("..organization"))
    role = Message.Role.USER
    text = "hello"
    content = factory.LazyAttribute(lambda m: [{"type": "text", "text": m.text}])


class ProviderFactory(OrgOwnedFactory):
    class Meta:
        model = Provider

    name = factory.Sequence(lambda n: f"provider{n}")
    provider_type = Provider.Type.OPENAI
    api_key = "sk-test-secret-value"
