//! LISTEN: a connection of its own that hears the NOTIFYs sent to a
//! channel, so that the claim loop wakes at an enqueue's commit.

use sqlx::postgres::PgListener;

use super::Store;

/// A LISTEN connection on one channel. After a lost connection, the next
/// [`Listener::recv`] reconnects and listens again.
pub struct Listener(PgListener);

impl Store {
    /// A connection of its own, listening on `channel`.
    pub async fn listen(&self, channel: &str) -> Result<Listener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(channel).await?;
        Ok(Listener(listener))
    }
}

impl Listener {
    /// The next notification's payload; `None` when the connection was
    /// lost (notifications may have been missed meanwhile).
    pub async fn recv(&mut self) -> Result<Option<String>, sqlx::Error> {
        Ok(self.0.try_recv().await?.map(|n| n.payload().to_string()))
    }
}
