//! A user's first hour with Sparring, through the generated client: a
//! project, a telephony integration with the numbers Sparring calls from,
//! a channel to the agent under test, two personas, a scripted scenario, a
//! test that plays it with both personas, a batch holding the test, a
//! reviewer invited by email; then everything read back and summarized.
//!
//! ```text
//! SPARRING_URL=http://127.0.0.1:8080 \
//! SPARRING_API_KEY=spk_… \
//! SPARRING_REVIEWER_EMAIL=reviewer@example.com \
//!   cargo run -p sparring-client --example first_hour
//! ```
//!
//! The reviewer must be a user already: one who signed in once with an ID
//! token, or was given a key with
//! `sparring admin create-key --user EMAIL --label LABEL`.
//! `SPARRING_URL` may end in `/v1` or not.

use std::error::Error;

use sparring_client::{types, Client};

pub type BoxError = Box<dyn Error + Send + Sync>;

/// Everything the first hour made, as read back from the server.
#[derive(Debug)]
pub struct FirstHour {
    pub project: types::Project,
    pub integration: types::Integration,
    pub phone_numbers: Vec<types::PhoneNumber>,
    pub channel: types::Channel,
    pub personas: Vec<types::Persona>,
    pub scenario: types::Scenario,
    pub test: types::Test,
    pub batch: types::Batch,
    pub members: Vec<types::ProjectMember>,
}

fn contains(name: &str, text: &str) -> Result<types::Evaluator, BoxError> {
    Ok(types::Evaluator::Contains {
        case_sensitive: false,
        critical: true,
        name: name.try_into()?,
        text: text.try_into()?,
    })
}

/// Creates the resources of a first hour with `client` (whose user becomes
/// the project's owner), invites `reviewer_email` as a reviewer, and reads
/// it all back.
pub async fn first_hour(client: &Client, reviewer_email: &str) -> Result<FirstHour, BoxError> {
    let project = client
        .create_project()
        .body_map(|b| {
            b.name("Dental clinic receptionist")
                .description(Some("Tests for the voice agent that books appointments".try_into().unwrap()))
        })
        .send()
        .await?
        .into_inner();
    let project_id = project.id.clone();

    // The telephony account Sparring calls from, with its numbers.
    let numbers = vec![
        types::PhoneNumber {
            number: "+14155550101".try_into()?,
            label: "caller 1".try_into()?,
            direction: types::PhoneDirection::Outbound,
        },
        types::PhoneNumber {
            number: "+14155550102".try_into()?,
            label: "caller 2".try_into()?,
            direction: types::PhoneDirection::Both,
        },
    ];
    let mut config = serde_json::Map::new();
    config.insert("account_sid".into(), "AC0123456789abcdef0123456789abcdef".into());
    let mut credentials = serde_json::Map::new();
    credentials.insert("auth_token".into(), "first-hour-example-token".into());
    let integration = client
        .create_integration()
        .body_map(|b| {
            b.project_id(project_id.clone())
                .provider(types::IntegrationProvider::Twilio)
                .name("Twilio")
                .config(config)
                .credentials(credentials)
                .phone_numbers(numbers)
        })
        .send()
        .await?
        .into_inner();

    // The agent under test answers the phone.
    let channel = client
        .create_channel()
        .body_map(|b| {
            b.project_id(project_id.clone())
                .name("Front desk line")
                .kind(types::ChannelKind::Phone)
                .target("+14155550100")
                .integration_id(Some(integration.id.clone()))
        })
        .send()
        .await?
        .into_inner();

    let mut personas = Vec::new();
    for (name, description) in [
        ("Busy parent", "Short answers, in a hurry, calls from a car"),
        ("Retired teacher", "Polite, detailed, asks to repeat things"),
    ] {
        let persona = client
            .create_persona()
            .body_map(|b| {
                b.project_id(project_id.clone()).name(name).description(Some(description.try_into().unwrap()))
            })
            .send()
            .await?
            .into_inner();
        personas.push(persona);
    }

    let steps = vec![
        types::ScenarioStep {
            say: "Hi, I'd like to book a cleaning.".try_into()?,
            expect: vec![contains("asks when", "when")?],
        },
        types::ScenarioStep { say: "Next Tuesday morning, please.".try_into()?, expect: vec![] },
    ];
    let scenario = client
        .create_scenario()
        .body_map(|b| {
            b.project_id(project_id.clone())
                .name("Book a cleaning")
                .mode(types::ScenarioMode::Scripted)
                .steps(steps)
                .default_persona_id(Some(personas[0].id.clone()))
        })
        .send()
        .await?
        .into_inner();

    let test = client
        .create_test()
        .body_map(|b| {
            b.project_id(project_id.clone())
                .name("Booking works for everyone")
                .channel_id(channel.id.clone())
                .scenario_id(scenario.id.clone())
                .persona_ids(personas.iter().map(|p| p.id.clone()).collect::<Vec<_>>())
                .iterations(std::num::NonZeroU32::new(2).unwrap())
                .pass_threshold(0.5)
                .evaluators(vec![contains("confirms", "booked").unwrap()])
                .tags(vec!["smoke".try_into().unwrap()])
        })
        .send()
        .await?
        .into_inner();

    let batch = client
        .create_batch()
        .body_map(|b| {
            b.project_id(project_id.clone())
                .name("Nightly")
                .test_ids(vec![test.id.clone()])
                .concurrency(std::num::NonZeroU32::new(2).unwrap())
        })
        .send()
        .await?
        .into_inner();

    client
        .add_project_member()
        .id(&project_id)
        .body_map(|b| b.email(Some(reviewer_email.parse().unwrap())).role(types::ProjectRole::Reviewer))
        .send()
        .await?;

    // Read it all back.
    Ok(FirstHour {
        project: client.get_project().id(&project_id).send().await?.into_inner(),
        integration: client.get_integration().id(&integration.id).send().await?.into_inner(),
        phone_numbers: client
            .list_integration_phone_numbers()
            .id(&integration.id)
            .send()
            .await?
            .into_inner()
            .phone_numbers,
        channel: client.get_channel().id(&channel.id).send().await?.into_inner(),
        personas: client.list_personas().project_id(&project_id).send().await?.into_inner().personas,
        scenario: client.get_scenario().id(&scenario.id).send().await?.into_inner(),
        test: client.get_test().id(&test.id).send().await?.into_inner(),
        batch: client.get_batch().id(&batch.id).send().await?.into_inner(),
        members: client.list_project_members().id(&project_id).send().await?.into_inner().members,
    })
}

impl FirstHour {
    /// A few lines saying what was made.
    pub fn summary(&self) -> String {
        let members: Vec<String> =
            self.members.iter().map(|m| format!("{} ({})", m.email.as_deref().unwrap_or(&m.user_id), m.role)).collect();
        [
            format!("project     {} \"{}\" (you are {})", self.project.id, self.project.name, self.project.role),
            format!(
                "integration {} {} with {} numbers, credentials {}",
                self.integration.id,
                self.integration.provider,
                self.phone_numbers.len(),
                if self.integration.credentials_configured { "configured" } else { "missing" }
            ),
            format!("channel     {} {} {}", self.channel.id, self.channel.kind, self.channel.target),
            format!(
                "personas    {}",
                self.personas.iter().map(|p| format!("{} \"{}\"", p.id, p.name)).collect::<Vec<_>>().join(", ")
            ),
            format!(
                "scenario    {} \"{}\" ({}, {} steps, version {})",
                self.scenario.id,
                self.scenario.name,
                self.scenario.mode,
                self.scenario.steps.len(),
                self.scenario.version
            ),
            format!(
                "test        {} \"{}\": {} personas × {} iterations, pass at {}",
                self.test.id,
                self.test.name,
                self.test.persona_ids.len(),
                self.test.iterations,
                self.test.pass_threshold
            ),
            format!(
                "batch       {} \"{}\": {} in the suite, {} at once",
                self.batch.id,
                self.batch.name,
                self.batch.test_ids.len(),
                self.batch.concurrency
            ),
            format!("members     {}", members.join(", ")),
        ]
        .join("\n")
    }
}

fn env(name: &str) -> Result<String, BoxError> {
    std::env::var(name).map_err(|_| format!("set {name}").into())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = env("SPARRING_URL")?;
    let url = url.trim_end_matches('/');
    let base = if url.ends_with("/v1") { url.to_string() } else { format!("{url}/v1") };
    let client = Client::with_api_key(&base, &env("SPARRING_API_KEY")?)?;
    let made = first_hour(&client, &env("SPARRING_REVIEWER_EMAIL")?).await?;
    println!("{}", made.summary());
    Ok(())
}
